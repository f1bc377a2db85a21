"""The llama.cpp backend: branches as POST /completion calls to a `llama-server`.

llama-server does E-GRM's fork its own way: `n_cmpl` (alias `n`) prefills a prompt once and
decodes n completions from copies of its KV (tools/server/server-context.cpp: the parent slot's
sequence is copied to its children, each child's seed is the parent's + its index). So M branches
that ask for the same thing, seeds consecutive, are ONE call. Branches that differ (the
temperature ladder) are M concurrent calls; the server batches its slots' work in one decode.
A branch continued later (the long path) is sent as its whole context: the server picks the slot
whose cached prompt shares the longest prefix with it (`cache_prompt`), so only the new tokens
are computed.

The wire format, from llama.cpp's tools/server (llama-cpp-python 0.3.36 vendors it):
- request (server-schema.cpp): `prompt` (token ids: no second tokenization), `n_predict`,
  `temperature`, `top_p`, `top_k`, `min_p`, `samplers` (the chain's order), `seed`, `stop`,
  `n_cmpl`, `n_probs`, `grammar` (GBNF), `ignore_eos`, `cache_prompt`, `return_tokens`.
- response (server-task.cpp to_json_non_oaicompat): one object, or a list of them for
  n_cmpl > 1, each {index, content, tokens, stop_type: "eos" | "word" | "limit",
  tokens_evaluated (the prompt), timings: {cache_n (prompt tokens reused), prompt_n (computed)},
  completion_probabilities: [{id, logprob, top_logprobs: [{id, logprob}, ...]}, ...]}; the
  log-probs are the model's own (softmax of the logits, T=1), not the sampler's.
- errors (server-common.cpp format_error_response): {"error": {"code", "message", "type"}}.
- health: GET /health ({"status": "ok"}; 503 while loading); model: GET /props (model_alias).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from egrm.aio import gather_or_cancel
from egrm.engines.base import (
    LIVE,
    BackendRejectedError,
    Branch,
    BranchParams,
    EngineUnavailableError,
    FinishReason,
)
from egrm.engines.embedded.constraint import TrieNode, build_trie
from egrm.engines.remote.base import TOKENIZER_PROBE, CompletionsEngine

_COMPLETION = "/completion"
# Top entries asked for at each constrained position: enough to hold every allowed first token
# of a Yes/No or short-answer choice, so the chosen one can be renormalised over them.
_CONSTRAINED_TOP = 20


def gbnf_choice(trie: TrieNode) -> str:
    """A GBNF grammar over token ids whose sentences are the paths of the answer trie: the same
    tokenisations the embedded engine allows (each answer bare and after a space), not any
    spelling of the characters, so the log-probs renormalise over the same tokens."""

    def alternatives(node: TrieNode) -> str:
        paths = [
            f"<[{token}]>" + (f" {alternatives(child)}" if child.children else "")
            for token, child in sorted(node.children.items())
        ]
        if node.terminal and node.children:
            return "(" + " | ".join(paths) + ")?"
        return "(" + " | ".join(paths) + ")"

    if not trie.children:
        raise ValueError("allowed must hold at least one non-empty answer")
    return "root ::= " + alternatives(trie)


def one_call(branches: Sequence[BranchParams]) -> BranchParams | None:
    """The parameters of a single n_cmpl call that samples all branches, when there is one: the
    same parameters and, if seeded, seeds that count up from the first (the server's child seeds)."""
    first = branches[0]
    for i, b in enumerate(branches):
        if replace(b, seed=first.seed) != first or b.seed != (None if first.seed is None else first.seed + i):
            return None
    return first


def completion_body(ids: list[int], p: BranchParams, n: int, trie: TrieNode | None = None) -> dict[str, Any]:
    """The POST /completion body for n branches of p (trie: the allowed answers' tokens)."""
    body: dict[str, Any] = {
        "prompt": ids,
        "n_predict": p.max_new_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        # The server's default chain is top-k 40, min-p 0.05, ... then temperature last: ours
        # is the method's (and HF's, SGLang's): temperature, then the nucleus, nothing else.
        "samplers": ["temperature", "top_p"],
        "top_k": 0,
        "min_p": 0.0,
        "n_cmpl": n,
        "n_probs": 1 if trie is None else _CONSTRAINED_TOP,
        "cache_prompt": True,
        "return_tokens": True,
        "seed": -1 if p.seed is None else p.seed,  # -1: the server draws one
    }
    if p.stop:
        body["stop"] = list(p.stop)
    if trie is not None:
        body["grammar"] = gbnf_choice(trie)
    if p.ignore_eos:
        body["ignore_eos"] = True
    return body


class LlamaCppEngine(CompletionsEngine):
    """url: the server's root (http://127.0.0.1:8080), as llama-server prints it."""

    KIND = "llama.cpp server"
    _served_model: str | None = None  # /props' model_alias, once the server answers

    @property
    def model_name(self) -> str:
        return self._served_model or self._tok.name

    async def sample(
        self, prefix: str | Sequence[int], branches: Sequence[BranchParams], tag: object = None
    ) -> list[Branch]:
        ids = self._prompt_ids(prefix, branches)
        async with self._slot(len(branches)):
            shared = one_call(branches)
            if shared is not None:
                return await self._complete(ids, shared, len(branches))
            done = await gather_or_cancel([self._complete(ids, b, 1) for b in branches])
        return [one[0] for one in done]

    def _trie(self, p: BranchParams) -> TrieNode | None:
        return None if p.allowed is None else build_trie(self._tok.tokenizer, tuple(p.allowed))

    async def _complete(self, ids: list[int], p: BranchParams, n: int, rank: int = LIVE) -> list[Branch]:
        # llama-server has no request priority: spare and background work run as live work.
        trie = self._trie(p)
        answer = await self._client.post(_COMPLETION, completion_body(ids, p, n, trie))
        self._stats.batches += 1
        results = answer if isinstance(answer, list) else [answer]
        try:
            results = sorted(results, key=lambda r: int(r.get("index") or 0))
            branches = [self._branch(ids, r, trie) for r in results]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self._client.malformed(_COMPLETION, f"{type(exc).__name__}: {exc}") from exc
        if len(branches) != n:
            raise self._client.malformed(_COMPLETION, f"{len(branches)} results for n_cmpl={n}")
        # The children of an n_cmpl call copied the parent's prompt KV (and report the parent's
        # timings): the first branch pays for the prompt, the others shared it.
        for b in branches[1:]:
            b.cached_prompt_tokens = b.prompt_tokens
        self._stats.prefix_cache_hit_tokens += sum(b.cached_prompt_tokens for b in branches)
        return branches

    def _branch(self, context: list[int], result: dict[str, Any], trie: TrieNode | None) -> Branch:
        probs = result.get("completion_probabilities") or []
        ids = [int(i) for i in result["tokens"]] if result.get("tokens") is not None else [int(p["id"]) for p in probs]
        logprobs = [float(p["logprob"]) for p in probs]
        text = str(result["content"])
        if result.get("stop_type") == "eos":
            ids, logprobs = self._tok.own_tokens(ids, logprobs)
        if trie is not None:
            ids, logprobs = self._constrained(ids, probs, trie)
            text = self._tok.decode(ids)
        prompt = int(result.get("tokens_evaluated") or len(context))
        timings = result.get("timings") or {}
        return Branch(
            text=text,
            token_ids=ids,
            finish_reason=FinishReason.LENGTH if result.get("stop_type") == "limit" else FinishReason.STOP,
            prompt_tokens=prompt,
            cached_prompt_tokens=min(prompt, int(timings.get("cache_n") or 0)),
            logprobs=logprobs,
            handle=self._handle(context, ids),
        )

    def _constrained(
        self, ids: list[int], probs: Sequence[dict[str, Any]], trie: TrieNode
    ) -> tuple[list[int], list[float]]:
        """A constrained answer as the embedded engine reports it: it ends at a leaf of the trie or
        where the end of turn follows a complete answer (neither is part of it), and each token's
        log-prob is renormalised over what the trie allowed there (the children, and the end of
        turn where an answer may end), so a Yes/No branch's two probabilities sum to one."""
        out_ids: list[int] = []
        out: list[float] = []
        node = trie
        for token, p in zip(ids, probs, strict=False):
            if token not in node.children:
                break  # the end of turn after a complete answer: not part of it
            top = {int(t["id"]): float(t["logprob"]) for t in p.get("top_logprobs") or []}
            allowed = set(node.children) | (self._tok.eos_ids if node.terminal else set())
            share = {t: v for t, v in top.items() if t in allowed} | {token: float(p["logprob"])}
            out_ids.append(token)
            out.append(share[token] - _logsumexp(list(share.values())))
            node = node.children[token]
            if node.is_leaf:
                break
        return out_ids, out

    async def ready(self) -> bool:
        if not await self._client.probe("/health", self._ready_timeout_s):
            return False
        if not await self._compare_tokenizers("/tokenize", {"content": TOKENIZER_PROBE, "add_special": False}):
            return False
        if self._served_model is None:  # the name is cosmetic: health and the tokenizer decide readiness
            try:
                props = await self._client.get("/props", self._ready_timeout_s)
            except (EngineUnavailableError, BackendRejectedError):
                return self._refusal is None
            alias = props.get("model_alias") if isinstance(props, dict) else None
            self._served_model = str(alias) if alias else None
        return self._refusal is None


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))
