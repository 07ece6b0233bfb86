"""End-to-end smoke test of a running server through the JSON API (loopback only).

    python scripts/smoke_api.py http://127.0.0.1:8000 <api token>

Starts a demo refund run, waits for it to halt, declines it with a reason, waits for the
run to finish, and checks the model read the reason. Exits non-zero on any surprise.
"""

from __future__ import annotations

import sys
import time

import httpx

REASON = "amount exceeds refund policy"


def wait_for(client: httpx.Client, run_id: int, status: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.get(f"/api/runs/{run_id}").raise_for_status().json()
        if run["status"] == status:
            return run
        if run["status"] == "failed":
            raise SystemExit(f"run failed: {run['error']}")
        time.sleep(0.1)
    raise SystemExit(f"run {run_id} did not reach {status} in {timeout}s (last: {run['status']})")


def main(base_url: str, token: str) -> int:
    with httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as client:
        run = client.post(
            "/api/runs", json={"agent": "demo", "prompt": "Refund order A-1001, $250"}
        )
        assert run.status_code == 201, run.text
        run_id = run.json()["id"]
        halted = wait_for(client, run_id, "pending")
        request_id = halted["pending"]["request"]["id"]
        print(f"run {run_id} halted on {request_id}: {halted['pending']['request']['prompt']}")
        declined = client.post(f"/api/requests/{request_id}/decline", json={"reason": REASON})
        assert declined.status_code == 200, declined.text
        again = client.post(f"/api/requests/{request_id}/decline", json={"reason": "twice"})
        assert again.status_code == 409, again.text
        done = wait_for(client, run_id, "done")
        print(f"run {run_id} done: {done['text']}")
        assert REASON in done["text"], done["text"]
        messages = client.get(f"/api/runs/{run_id}/messages").raise_for_status().json()
        assert any(m.get("content") == f"relay declined for refund: {REASON}" for m in messages), (
            messages
        )
    print("smoke: ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
