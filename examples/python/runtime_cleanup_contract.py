"""The platform's side of the runtime-cleanup contract, in Python (docs/adopting.md).

Each function is one step of docs/integration.md, section 1, "What the platform does", written
against the worked example's own columns (examples/adoption/platform-schema.sql, adopted by
examples/adoption/adopt.sql): the platform writes ``user_id`` and ``thread_id``; the runtime scope
is the thread. Debian's python3-psycopg2 and python3-boto3 are all it needs.

Every transaction that asks ``runtime_cleanup_blocked`` or records a sandbox begins
``ISOLATION LEVEL READ COMMITTED`` itself: the database's default may be higher, and then those
answer SQLSTATE 25000 instead of reading a snapshot older than the scope's lock. So connections
are in autocommit mode and each transaction is spelled out (``read_committed``).

test/platform/python-examples.test.ts runs admit_run.py and finish_run.py against the local stack.
"""

import hashlib
import json
import urllib.request
from contextlib import contextmanager
from typing import Iterator, Optional

import psycopg2

RUN_FINISHED_QUEUE = "run-finished"
# SQLSTATE of "the sandbox is being reclaimed": the record is refused until the time it names.
SANDBOX_BEING_RECLAIMED = "55006"


class SandboxBeingReclaimed(Exception):
    """The record of a sandbox was refused: a reclaim's DELETE of that id may still act."""


def connect(database_url: str):
    conn = psycopg2.connect(database_url)
    conn.autocommit = True
    return conn


@contextmanager
def read_committed(conn) -> Iterator:
    with conn.cursor() as cur:
        cur.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        try:
            yield cur
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")


def sandbox_id_of(thread_id: str) -> str:
    """The platform's own rule: one sandbox per conversation, its id derived from the thread."""
    return "sbx-" + hashlib.sha256(thread_id.encode()).hexdigest()[:12]


class RunIdTaken(Exception):
    """The run id is already another thread's run, or a run that has ended: not this admission's."""


class NotTerminal(Exception):
    """finish_run was given a status the database does not count as terminal."""


def admit_run(conn, run_id: str, user_id: str, thread_id: str) -> bool:
    """Step 2: inserts the run only while its scope is free; False when the scope is blocked.

    The scope's lock is taken in a statement of its own: a statement's snapshot is taken when it
    starts, so an insert that took the lock itself would check the fence as it was before.

    Idempotent for the same run id in the same thread: an earlier attempt that was admitted but got
    no sandbox (its record refused, its POST failed) left the run active, so admitting it again
    answers True and the caller POSTs and records again. Without that, the retry failed on the
    primary key and the orphan active run kept the thread busy. An id that is another thread's run,
    or a run that has ended, raises RunIdTaken.
    """
    with read_committed(conn) as cur:
        cur.execute(
            "SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key(%s, %s))", (user_id, thread_id)
        )
        cur.execute(
            """
            INSERT INTO agent_runs (id, user_id, thread_id, status)
            SELECT %(run_id)s, %(user_id)s, %(thread_id)s, 'running'
            WHERE NOT runtime_cleanup_blocked(%(user_id)s, %(thread_id)s)
            ON CONFLICT (id) DO NOTHING
            RETURNING id
            """,
            {"run_id": run_id, "user_id": user_id, "thread_id": thread_id},
        )
        if cur.fetchone() is not None:
            return True
        # Not inserted: blocked, or the id exists. An existing active run of this thread was admitted
        # before (under this same lock), and its being active keeps any cleanup of the thread waiting.
        cur.execute(
            """
            SELECT user_id = %(user_id)s AND thread_id = %(thread_id)s,
                   runtime_cleanup_status_is_active(status)
            FROM agent_runs WHERE id = %(run_id)s
            """,
            {"run_id": run_id, "user_id": user_id, "thread_id": thread_id},
        )
        existing = cur.fetchone()
        if existing is None:
            return False
        same_thread, active = existing
        if not same_thread:
            raise RunIdTaken(f"run {run_id} is another thread's run")
        if not active:
            raise RunIdTaken(f"run {run_id} has ended; a new run needs a new id")
        return True


def create_sandbox(
    provisioner_url: str, sandbox_id: str, thread_id: str, user_id: str, token: Optional[str] = None
) -> dict:
    """POST /api/sandboxes: the live sandbox of that id, created when there is none."""
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        provisioner_url.rstrip("/") + "/api/sandboxes",
        data=json.dumps({"sandbox_id": sandbox_id, "thread_id": thread_id, "user_id": user_id}).encode(),
        headers=headers,
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def record_sandbox(
    conn, user_id: str, thread_id: str, sandbox_id: str, generation: Optional[int] = None
) -> int:
    """Step 3: records the scope's sandbox; returns the generation recorded.

    ``generation`` is the provisioner's, when it reports one. The platform's provisioner reports
    none and reuses the id of a conversation, so the platform counts its own: 1 for the scope's
    first record, one up on every later one. Recording the same number again would leave the row
    marked released by the previous cleanup, and the next cleanup would leave this container
    running. Raises SandboxBeingReclaimed on 55006: POST again after the time it names, then
    record what that POST answered.
    """
    try:
        with read_committed(conn) as cur:
            cur.execute(
                """
                INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
                VALUES (%(user_id)s, %(thread_id)s, %(sandbox_id)s, COALESCE(%(generation)s, 1))
                ON CONFLICT (uid, runtime_scope_id) DO UPDATE
                SET sandbox_id = EXCLUDED.sandbox_id,
                    generation = COALESCE(%(generation)s, sandbox_runtimes.generation + 1)
                RETURNING generation
                """,
                {
                    "user_id": user_id,
                    "thread_id": thread_id,
                    "sandbox_id": sandbox_id,
                    "generation": generation,
                },
            )
            return cur.fetchone()[0]
    except psycopg2.Error as error:
        if error.pgcode == SANDBOX_BEING_RECLAIMED:
            raise SandboxBeingReclaimed(error.pgerror.strip()) from error
        raise


def finish_run(conn, run_id: str, status: str = "completed") -> bool:
    """Step 1: the terminal status and, for a root run, the fence, in one statement.

    Returns whether a fence was raised: only then is the run announced. The UPDATE itself asks the
    database's rule (runtime_cleanup_status_is_terminal) whether the status is terminal, so the list
    lives in one place; a run given a non-terminal status with a fence would have its sandbox deleted
    while it still counts as running. Raises NotTerminal for such a status, changing nothing.
    """
    with conn.cursor() as cur:
        cur.execute(
            """
            UPDATE agent_runs
            SET status = %(status)s, finished_at = now(), updated_at = now(),
                runtime_cleanup_pending = (run_type <> 'subagent')
            WHERE id = %(run_id)s AND runtime_cleanup_status_is_terminal(%(status)s::text)
            RETURNING runtime_cleanup_pending
            """,
            {"status": status, "run_id": run_id},
        )
        row = cur.fetchone()
        if row is None:
            cur.execute("SELECT runtime_cleanup_status_is_terminal(%s::text)", (status,))
            if not cur.fetchone()[0]:
                raise NotTerminal(f"status {status!r} is not terminal; run {run_id} left as it was")
        return bool(row and row[0])


def run_finished_queue_url(sqs, queue_name_prefix: str = "") -> str:
    """The deployed name carries the stage prefix (QUEUE_NAME_PREFIX, e.g. "prod-")."""
    return sqs.get_queue_url(QueueName=queue_name_prefix + RUN_FINISHED_QUEUE)["QueueUrl"]


def announce_run_finished(sqs, queue_url: str, run_id: str) -> str:
    """Step 1's announcement: {"runId": "<id>"} on run-finished; returns the message id.

    A lost announcement is not fatal: the sweeper finds every fence pending longer than
    FENCE_SWEEP_AFTER_SECONDS and announces it again.
    """
    return sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps({"runId": run_id}))["MessageId"]
