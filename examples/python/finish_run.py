#!/usr/bin/env python3
"""Ends a run and announces it on run-finished, as the platform's arq worker does at a job's end.

    DATABASE_URL=postgres://… python3 finish_run.py --run-id RUN [--status completed]

Prints one JSON line: whether a fence was raised (a root run's, not a subagent's) and, if so, the
announcement's message id. boto3 finds the queue with its usual configuration (region,
credentials); AWS_ENDPOINT_URL_SQS names another endpoint (a local one), QUEUE_NAME_PREFIX the
stage's prefix of the queue names. Exit status 2: the status is not a terminal one (the
database's rule); the run is left as it was and no fence is raised.
"""

import argparse
import json
import os
import sys

import boto3

from runtime_cleanup_contract import (
    NotTerminal,
    announce_run_finished,
    connect,
    finish_run,
    run_finished_queue_url,
)

REFUSED = 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-id", required=True)
    parser.add_argument(
        "--status",
        default="completed",
        # The database says which statuses are terminal (runtime_cleanup_status_is_terminal).
        help="a terminal status (refused otherwise, exit 2)",
    )
    args = parser.parse_args()

    conn = connect(os.environ["DATABASE_URL"])
    try:
        fenced = finish_run(conn, args.run_id, args.status)
    except NotTerminal as refused:
        print(json.dumps({"runId": args.run_id, "fenced": False, "refused": str(refused)}))
        return REFUSED
    finally:
        conn.close()
    result = {"runId": args.run_id, "fenced": fenced}
    if fenced:
        # Older boto3 releases do not read AWS_ENDPOINT_URL_SQS themselves.
        sqs = boto3.client("sqs", endpoint_url=os.environ.get("AWS_ENDPOINT_URL_SQS") or None)
        queue_url = run_finished_queue_url(sqs, os.environ.get("QUEUE_NAME_PREFIX", ""))
        result["messageId"] = announce_run_finished(sqs, queue_url, args.run_id)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
