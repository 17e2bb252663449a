/**
 * Powertools' FIFO processors handle records one by one; a release can take minutes, so a batch
 * of releases for different scopes would run back to back and starve the last ones of time.
 * This processor keeps FIFO semantics where they matter, inside a message group: groups run
 * concurrently, records of one group in order, and after a failure the rest of that group is
 * failed unprocessed (SQS must not delete them, and must not run them out of order).
 *
 * `onSkipped` lets the caller delay a skipped record's return to match the failed one's backoff.
 */
import { BatchProcessor, EventType } from '@aws-lambda-powertools/batch';
import type { SQSRecord } from 'aws-lambda';

export class SkippedAfterGroupFailureError extends Error {
  constructor(groupId: string) {
    super(`skipped: an earlier message of group ${groupId} failed in this batch`);
    this.name = 'SkippedAfterGroupFailureError';
  }
}

export class FifoGroupProcessor extends BatchProcessor {
  readonly #onSkipped: (record: SQSRecord) => Promise<void>;

  constructor(onSkipped: (record: SQSRecord) => Promise<void>) {
    super(EventType.SQS);
    this.#onSkipped = onSkipped;
  }

  override async process() {
    this.prepare();
    const groups = new Map<string, SQSRecord[]>();
    for (const record of this.records as SQSRecord[]) {
      const groupId = record.attributes?.MessageGroupId ?? '';
      const group = groups.get(groupId);
      if (group) group.push(record);
      else groups.set(groupId, [record]);
    }
    const perGroup = await Promise.all(
      [...groups.entries()].map(async ([groupId, records]) => {
        const results = [];
        let failed = false;
        for (const record of records) {
          if (failed) {
            await this.#onSkipped(record).catch(() => {});
            results.push(this.failureHandler(record, new SkippedAfterGroupFailureError(groupId)));
            continue;
          }
          const result = await this.processRecord(record);
          if (result[0] === 'fail') failed = true;
          results.push(result);
        }
        return results;
      }),
    );
    this.clean();
    return perGroup.flat();
  }
}
