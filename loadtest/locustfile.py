"""A realistic reward-service load: single items, batches of 8 and 32, auto routing.

Run by `make loadtest` (which starts a server), or by hand:
    locust -f loadtest/locustfile.py --host http://127.0.0.1:8000
Set EGRM_API_KEY to send a bearer key.
"""

from __future__ import annotations

import os
import random

from locust import HttpUser, between, task

QUESTIONS = [
    ("What is {a} + {b}?", lambda a, b: a + b),
    ("What is {a} - {b}?", lambda a, b: a - b),
    ("What is {a} times {b}?", lambda a, b: a * b),
]


def make_item(rng: random.Random) -> dict[str, str]:
    template, op = rng.choice(QUESTIONS)
    a, b = rng.randint(2, 99), rng.randint(2, 9)
    answer = op(a, b) + rng.choice([0, 0, 1, -1, 10])  # right about half the time, near misses otherwise
    return {"prompt": template.format(a=a, b=b), "response": f"The answer is {answer}."}


class RewardClient(HttpUser):
    wait_time = between(0.05, 0.2)

    def on_start(self) -> None:
        self.rng = random.Random()
        key = os.environ.get("EGRM_API_KEY")
        if key:
            self.client.headers["Authorization"] = f"Bearer {key}"

    def _score(self, n: int, name: str) -> None:
        body = {"items": [make_item(self.rng) for _ in range(n)], "options": {"path": "auto"}}
        with self.client.post("/v1/rewards", json=body, name=name, catch_response=True, timeout=300) as r:
            if r.status_code != 200:
                r.failure(f"status {r.status_code}: {r.text[:200]}")
                return
            results = r.json()["results"]
            if len(results) != n or any(x["error"] or x["reward"] is None for x in results):
                r.failure(f"lost or failed items: {r.text[:200]}")

    @task(6)
    def single(self) -> None:
        self._score(1, "rewards x1")

    @task(3)
    def batch_of_8(self) -> None:
        self._score(8, "rewards x8")

    @task(1)
    def batch_of_32(self) -> None:
        self._score(32, "rewards x32")
