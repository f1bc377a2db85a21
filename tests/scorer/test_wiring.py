"""The scorer's wire models, its factory and the API's choice of scorer (no processes)."""

import asyncio
import dataclasses

import pytest
from pydantic import ValidationError

from egrm.config import Settings
from egrm.factory import build_scorer
from egrm.pipeline.scorer import Candidate
from egrm.scorer.client import HttpScorer
from egrm.scorer.heuristic import HeuristicScorer
from egrm.scorer.model import DEFAULT_CHECKPOINT, TrainedScorer
from egrm.scorer.registry import ScorerLoadError, load_scorer
from egrm.scorer.wire import CandidateIn

CANDIDATE = Candidate("Is 2+2=4?", "Yes", "Yes. Reasoning: 2+2 is 4.", "Yes", -0.4, 0.8, 12)


def test_wire_model_mirrors_the_candidate_dataclass():
    assert list(CandidateIn.model_fields) == [f.name for f in dataclasses.fields(Candidate)]
    assert CandidateIn(**dataclasses.asdict(CANDIDATE)).to_candidate() == CANDIDATE


def test_the_shipped_checkpoint_is_the_default_and_the_heuristic_opt_in():
    assert all(isinstance(load_scorer(c), TrainedScorer) for c in (None, "", "trained"))
    assert isinstance(load_scorer("heuristic"), HeuristicScorer)


def test_a_folder_or_file_checkpoint_loads(tmp_path):
    (tmp_path / "scorer.json").write_text(DEFAULT_CHECKPOINT.read_text())
    assert load_scorer(tmp_path).predict([CANDIDATE]) == load_scorer(tmp_path / "scorer.json").predict([CANDIDATE])


def test_a_bad_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ScorerLoadError, match="not a scorer checkpoint"):
        load_scorer(tmp_path)  # a folder without scorer.json


def test_the_api_uses_the_worker_only_when_a_url_is_set():
    assert isinstance(build_scorer(Settings()), TrainedScorer)
    assert isinstance(build_scorer(Settings(scorer_checkpoint="heuristic", long_accept=0)), HeuristicScorer)
    remote = build_scorer(Settings(scorer_url="http://127.0.0.1:8001/", scorer_timeout_s=2, scorer_retries=0))
    assert isinstance(remote, HttpScorer) and remote.url == "http://127.0.0.1:8001"
    asyncio.run(remote.close())


def test_early_stop_is_refused_with_the_heuristic_scorer():
    # Scored alone, a candidate agrees with itself: the heuristic would accept it on half a score.
    with pytest.raises(ValueError, match="EGRM_LONG_ACCEPT=0 with EGRM_SCORER_CHECKPOINT=heuristic"):
        Settings(scorer_checkpoint="heuristic")


@pytest.mark.parametrize("url", ["127.0.0.1:8001", "ftp://host", "http://"])
def test_a_bad_scorer_url_names_the_setting(url):
    with pytest.raises(ValidationError, match="EGRM_SCORER_URL"):
        Settings(scorer_url=url)


@pytest.mark.parametrize(("field", "value"), [("scorer_timeout_s", 0), ("scorer_retries", -1), ("scorer_retries", 6)])
def test_scorer_bounds(field, value):
    with pytest.raises(ValidationError, match=field):
        Settings(**{field: value})
