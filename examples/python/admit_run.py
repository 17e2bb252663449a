#!/usr/bin/env python3
"""Admits a run in its thread and gives it the thread's sandbox, as the platform's API does.

    DATABASE_URL=postgres://… SANDBOX_PROVISIONER_URL=http://… \
      python3 admit_run.py --run-id RUN --user-id USER --thread-id THREAD

Prints one JSON line. Exit status: 0 admitted and its sandbox recorded; 3 not admitted, the
thread's previous sandbox is still being cleaned up (try again later); 75 admitted, but the
sandbox's record was refused while a reclaim may still delete it (POST and record again after the
time the message names); 2 the run id is another thread's run, or one that has ended.

Running the same command again is safe: a run already admitted in that thread (by an attempt that
exited 75, or whose POST failed) is admitted again, and its sandbox created and recorded.
SANDBOX_PROVISIONER_TOKEN, when set, is sent as the bearer token.
"""

import argparse
import json
import os
import sys

from runtime_cleanup_contract import (
    RunIdTaken,
    SandboxBeingReclaimed,
    admit_run,
    connect,
    create_sandbox,
    record_sandbox,
    sandbox_id_of,
)

REFUSED = 2
BLOCKED = 3
TRY_AGAIN_LATER = 75


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--user-id", required=True)
    parser.add_argument("--thread-id", required=True)
    args = parser.parse_args()

    conn = connect(os.environ["DATABASE_URL"])
    try:
        try:
            admitted = admit_run(conn, args.run_id, args.user_id, args.thread_id)
        except RunIdTaken as taken:
            print(json.dumps({"runId": args.run_id, "admitted": False, "refused": str(taken)}))
            return REFUSED
        if not admitted:
            print(json.dumps({"runId": args.run_id, "admitted": False}))
            return BLOCKED
        # The POST is outside the scope's lock: the reclaimer never waits on it for an unrecorded id.
        sandbox_id = sandbox_id_of(args.thread_id)
        created = create_sandbox(
            os.environ["SANDBOX_PROVISIONER_URL"],
            sandbox_id,
            args.thread_id,
            args.user_id,
            os.environ.get("SANDBOX_PROVISIONER_TOKEN"),
        )
        try:
            generation = record_sandbox(
                conn, args.user_id, args.thread_id, sandbox_id, created.get("generation")
            )
        except SandboxBeingReclaimed as refused:
            # The run has no sandbox yet: never hand it one whose record did not commit.
            print(json.dumps({"runId": args.run_id, "admitted": True, "refused": str(refused)}))
            return TRY_AGAIN_LATER
        print(
            json.dumps(
                {
                    "runId": args.run_id,
                    "admitted": True,
                    "sandboxId": sandbox_id,
                    "generation": generation,
                }
            )
        )
        return 0
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
