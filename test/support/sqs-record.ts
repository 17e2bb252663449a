/**
 * An SQS record as Lambda's event source mapping hands it to a handler, built by hand so that a
 * test can put in one batch what the emulator would never deliver together (two records of one
 * FIFO group, a chosen mix of bodies). Received once, unless `attributes` says otherwise.
 */
import { randomUUID } from 'node:crypto';
import type { SQSRecord } from 'aws-lambda';

export function sqsRecord(
  body: string,
  options: {
    queue?: string;
    attributes?: Partial<SQSRecord['attributes']>;
    /** Message attributes as the sender set them (String values). */
    messageAttributes?: Record<string, string>;
  } = {},
): SQSRecord {
  return {
    messageId: randomUUID(),
    receiptHandle: `not-a-real-receipt-${randomUUID()}`,
    body,
    attributes: {
      ApproximateReceiveCount: '1',
      SentTimestamp: String(Date.now()),
      SenderId: 'test',
      ApproximateFirstReceiveTimestamp: String(Date.now()),
      ...options.attributes,
    },
    messageAttributes: Object.fromEntries(
      Object.entries(options.messageAttributes ?? {}).map(([key, value]) => [
        key,
        { dataType: 'String', stringValue: value },
      ]),
    ),
    md5OfBody: '',
    eventSource: 'aws:sqs',
    eventSourceARN: `arn:aws:sqs:us-east-1:000000000000:${options.queue ?? 'test'}`,
    awsRegion: 'us-east-1',
  };
}
