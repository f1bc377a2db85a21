"""What the scorer reads in a candidate's reasoning: whether its arithmetic steps hold.

A chain of reasoning goes wrong at a step (`83-47=83-40-7=43-7=46`): the step that slipped is
written in the text, and checking it needs no model. Each line's `=`-separated segments that are
plain arithmetic (numbers, + - * / × ·, parentheses) are evaluated exactly, and every link
between two such neighbours is a checked step. The first line is the judge's own short answer
(what the reasoning sets out to check), so only the working after it counts. Text that holds no
arithmetic gives no checked step: the scorer then leans on the engine's signals alone.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from fractions import Fraction

_ARITHMETIC = re.compile(r"[\d\s+\-*/×·().,]+")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
# Where one statement ends and the next begins: "…=440, so 55*80=4400. 4400+440=4840."
_CLAUSES = re.compile(r"[,;:]|\.(?:\s+|$)|\s(?:so|then|and|thus)\s")
_MAX_CHARS = 120  # longer segments are prose, or an attack on the parser: not checked
_MAX_VALUE = 10**15

_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


@dataclass(frozen=True, slots=True)
class Steps:
    checked: int  # links between two arithmetic segments
    wrong: int  # of those, the ones whose sides differ

    @property
    def slips(self) -> float:
        """Share of checked steps that do not hold (0 when none could be checked)."""
        return self.wrong / self.checked if self.checked else 0.0


def value(segment: str) -> Fraction | None:
    """The exact value of a segment of plain arithmetic, or None."""
    text = _THOUSANDS.sub("", segment.strip().rstrip(".").strip())
    if not text or len(text) > _MAX_CHARS or not _ARITHMETIC.fullmatch(text) or not re.search(r"\d", text):
        return None
    try:
        tree = ast.parse(text.replace("×", "*").replace("·", "*"), mode="eval")
        return _evaluate(tree.body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError):
        return None


def _evaluate(node: ast.expr) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        result = Fraction(str(node.value))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _evaluate(node.operand)
        result = -inner if isinstance(node.op, ast.USub) else inner
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        result = _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        result = _evaluate(node.left) / _evaluate(node.right)
    else:
        raise ValueError("not plain arithmetic")
    if abs(result) > _MAX_VALUE:
        raise ValueError("too large to be a step")
    return result


def steps(reasoning: str) -> Steps:
    """The checked steps of the working (every line after the first)."""
    checked = wrong = 0
    for line in reasoning.splitlines()[1:]:
        for clause in _CLAUSES.split(_THOUSANDS.sub("", line)):
            values = [value(segment) for segment in clause.split("=")]
            for left, right in zip(values, values[1:], strict=False):
                if left is not None and right is not None:
                    checked += 1
                    wrong += left != right
    return Steps(checked, wrong)
