"""A sandbox provisioner written in FastAPI, behaving as the agent platform's own does.

Written here from the platform provisioner's documented behaviour, not from its code:

- ``DELETE /api/sandboxes/{sandbox_id}`` ignores any ``generation`` and answers ``200`` with a JSON
  object, whether or not the sandbox existed (``PROVISIONER_ABSENT_STATUS=404`` makes an unknown
  sandbox a FastAPI ``HTTPException(404)`` instead: ``{"detail": "Sandbox not found"}``, the same
  status and media type as FastAPI's own "no such route").
- ``POST /api/sandboxes`` returns the live sandbox of that id when there is one (reuse), and
  otherwise creates one. No ``generation`` anywhere.
- ``GET /api/sandboxes`` lists ``{"sandboxes": [{sandbox_id, sandbox_url, status}], "count": N}``.
- An idle reaper deletes sandboxes unused for ``SANDBOX_IDLE_TIMEOUT_SECONDS`` (off when unset).
- ``PROVISIONER_TOKEN``: when set, every ``/api`` request must carry ``Authorization: Bearer
  <token>`` (else ``401`` with ``WWW-Authenticate: Bearer``).
- ``PROVISIONER_PREFIX``: the API is served under this path (a gateway route), e.g. ``/provisioner``.

Any other path is FastAPI's own ``404 {"detail":"Not Found"}``. Sandboxes are in-memory records.
``/_test/requests`` (outside any prefix, no token) lists every request the API saw, so a test can
count them; it never records the Authorization header, only whether it was right.

Run by test/support/fastapi-provisioner.ts with Debian's uvicorn:
``/usr/bin/python3 -I -m uvicorn --app-dir <this folder> --factory app:create_app --port 0``.
"""

import asyncio
import hmac
import itertools
import os
import time
from typing import Dict, List, Optional

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel


class CreateSandbox(BaseModel):
    sandbox_id: str
    thread_id: str
    user_id: str


def _setting(name: str) -> Optional[str]:
    value = os.environ.get(name, "").strip()
    return value or None


def create_app() -> FastAPI:
    prefix = (_setting("PROVISIONER_PREFIX") or "").rstrip("/")
    token = _setting("PROVISIONER_TOKEN")
    absent_status = int(_setting("PROVISIONER_ABSENT_STATUS") or "200")
    if absent_status not in (200, 404):
        raise ValueError("PROVISIONER_ABSENT_STATUS must be 200 or 404")
    idle_timeout = float(_setting("SANDBOX_IDLE_TIMEOUT_SECONDS") or "0")

    app = FastAPI(title="sandbox provisioner (platform-like, for tests)")
    sandboxes: Dict[str, dict] = {}
    requests: List[dict] = []
    containers = itertools.count(1)

    def bearer_state(request: Request) -> str:
        header = request.headers.get("authorization")
        if header is None:
            return "none"
        scheme, _, credentials = header.partition(" ")
        if token is not None and scheme.lower() == "bearer" and hmac.compare_digest(
            credentials.strip().encode(), token.encode()
        ):
            return "valid"
        return "invalid"

    @app.middleware("http")
    async def record(request: Request, call_next):
        response = await call_next(request)
        if not request.url.path.startswith("/_test/"):
            requests.append(
                {
                    "method": request.method,
                    "path": request.url.path,
                    "query": request.url.query,
                    "status": response.status_code,
                    "bearer": bearer_state(request),
                }
            )
        return response

    def require_token(request: Request) -> None:
        if token is not None and bearer_state(request) != "valid":
            raise HTTPException(
                status_code=401,
                detail="Not authenticated",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def view(record: dict) -> dict:
        return {
            "sandbox_id": record["sandbox_id"],
            "sandbox_url": record["sandbox_url"],
            "status": record["status"],
        }

    router = APIRouter(prefix=f"{prefix}/api/sandboxes", dependencies=[Depends(require_token)])

    @router.post("")
    def create(body: CreateSandbox) -> dict:
        record = sandboxes.get(body.sandbox_id)
        if record is None:
            # A container of its own: its URL changes when the id is created again.
            record = {
                "sandbox_id": body.sandbox_id,
                "sandbox_url": f"http://sandbox-{next(containers)}.internal:8080",
                "status": "running",
            }
            sandboxes[body.sandbox_id] = record
        record["last_used"] = time.monotonic()
        return view(record)

    @router.get("")
    def list_sandboxes() -> dict:
        listed = [view(record) for record in sandboxes.values()]
        return {"sandboxes": listed, "count": len(listed)}

    @router.get("/{sandbox_id}")
    def get_sandbox(sandbox_id: str) -> dict:
        record = sandboxes.get(sandbox_id)
        if record is None:
            raise HTTPException(status_code=404, detail="Sandbox not found")
        record["last_used"] = time.monotonic()
        return view(record)

    @router.delete("/{sandbox_id}")
    def delete_sandbox(sandbox_id: str) -> dict:
        # `generation` is not looked at: the platform's provisioner knows none.
        record = sandboxes.pop(sandbox_id, None)
        if record is None:
            if absent_status == 404:
                raise HTTPException(status_code=404, detail="Sandbox not found")
            return {"sandbox_id": sandbox_id, "message": "sandbox not found, nothing to delete"}
        return {"sandbox_id": sandbox_id, "message": "sandbox deleted"}

    app.include_router(router)

    @app.get("/_test/requests")
    def audit() -> list:
        return requests

    @app.delete("/_test/requests")
    def clear_audit() -> dict:
        requests.clear()
        return {"cleared": True}

    async def reap_idle() -> None:
        while True:
            await asyncio.sleep(max(idle_timeout / 4, 0.05))
            now = time.monotonic()
            for sandbox_id, record in list(sandboxes.items()):
                if now - record["last_used"] > idle_timeout:
                    sandboxes.pop(sandbox_id, None)

    if idle_timeout > 0:

        @app.on_event("startup")
        async def start_reaper() -> None:
            app.state.reaper = asyncio.get_running_loop().create_task(reap_idle())

    return app
