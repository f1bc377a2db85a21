"""The examples of README.md and of every page under docs/, run against a real `egrm serve` on the
default settings: what they show is what the service answers.

- A ```bash block with `curl ... http://127.0.0.1:8000/PATH ... -d '{...}'` is posted as written,
  and the ```json block right after it must be contained in the answer (every key it shows, with
  its value; numbers to 3 decimals; lists item by item).
- A ```pycon block runs as a doctest (its output lines are the real output).
"""

from __future__ import annotations

import doctest
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtest.serverproc import egrm_process

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHOWN_URL = "http://127.0.0.1:8000"
_BLOCK = re.compile(r"```(\w+)[^\n]*\n(.*?)```", re.DOTALL)
_CURL = re.compile(r"curl -s (?P<url>http://127\.0\.0\.1:8000(?P<path>/[\w/]+)).*?-d '(?P<body>.*?)'", re.DOTALL)


def blocks() -> list[tuple[str, str]]:
    """Every fenced block of every page, page by page (a curl block and its answer are on one page)."""
    return [(m.group(1), m.group(2)) for page in PAGES for m in _BLOCK.finditer(page.read_text())]


def curl_examples() -> list[tuple[str, dict[str, Any], Any]]:
    """(path, body, the answer shown) of each curl example followed by a json block."""
    found = blocks()
    out = []
    for (lang, text), (next_lang, shown) in zip(found, found[1:], strict=False):
        curl = _CURL.search(text) if lang == "bash" else None
        if curl is not None and next_lang == "json":
            out.append((curl.group("path"), json.loads(curl.group("body")), json.loads(shown)))
    return out


def pycon_examples() -> list[str]:
    return [text for lang, text in blocks() if lang == "pycon"]


def contains(answer: Any, shown: Any, where: str = "") -> None:
    """Every key and value the README shows is in the answer."""
    if isinstance(shown, dict):
        assert isinstance(answer, dict), f"{where}: expected an object, got {answer!r}"
        for key, value in shown.items():
            assert key in answer, f"{where}.{key}: missing from the answer"
            contains(answer[key], value, f"{where}.{key}")
    elif isinstance(shown, list):
        assert isinstance(answer, list) and len(answer) == len(shown), f"{where}: {answer!r} vs shown {shown!r}"
        for i, (a, s) in enumerate(zip(answer, shown, strict=True)):
            contains(a, s, f"{where}[{i}]")
    elif isinstance(shown, float):
        assert isinstance(answer, int | float) and round(answer, 3) == shown, f"{where}: {answer!r} vs shown {shown}"
    else:
        assert answer == shown, f"{where}: {answer!r} vs shown {shown!r}"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    # float32 (what `auto` serves on an AVX2-only CPU): the same arithmetic on every machine, so a
    # sampled answer does not turn on bf16 rounding. The examples agree in bf16 too (checked by hand).
    with egrm_process("serve", {"EGRM_DTYPE": "float32"}) as (url, _):
        yield url


def test_the_pages_have_examples_to_run() -> None:
    assert len(curl_examples()) >= 2 and len(pycon_examples()) >= 3
    front = _BLOCK.findall(PAGES[0].read_text())
    assert any(lang == "bash" and "curl" in text for lang, text in front)  # the quick start runs too


def test_the_front_page_stays_short_and_maps_every_page() -> None:
    readme = PAGES[0].read_text()
    assert readme.count("\n") < 300 and "make serve" in readme and "make test" in readme
    assert all(f"(docs/{page.name})" in readme for page in PAGES[1:])


@pytest.mark.parametrize("index", range(len(curl_examples())))
def test_curl_example_answers_what_the_readme_shows(server: str, index: int) -> None:
    path, body, shown = curl_examples()[index]
    answer = httpx.post(server + path, json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    contains(answer.json(), shown, path)


@pytest.mark.parametrize("index", range(len(pycon_examples())))
def test_python_example_prints_what_the_readme_shows(server: str, index: int) -> None:
    source = pycon_examples()[index].replace(SHOWN_URL, server)
    test = doctest.DocTestParser().get_doctest(source, {}, f"pycon block {index}", "README.md or docs/", 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    failures: list[str] = []
    runner.run(test, out=failures.append)
    assert runner.failures == 0, "".join(failures)
