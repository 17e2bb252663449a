/**
 * Counts every call the stack's SQS client makes — the functions' sends (which `Queues.stats` also
 * counts) and the event sources' receives and deletes (which it does not) — by command, telling
 * empty long-poll receives apart from receives that brought messages.
 */
import type { SQSClient } from '@aws-sdk/client-sqs';

export type SqsCallCounts = Record<string, number>;

export function countSqsCalls(client: SQSClient): { snapshot(): SqsCallCounts } {
  const counts: SqsCallCounts = {};
  client.middlewareStack.add(
    (next, context) => async (args) => {
      const result = await next(args);
      let name = context.commandName ?? 'Unknown';
      if (name === 'ReceiveMessageCommand') {
        const messages = (result.output as { Messages?: unknown[] }).Messages ?? [];
        name = messages.length ? 'ReceiveMessageCommand' : 'ReceiveMessageCommand (empty)';
      }
      counts[name] = (counts[name] ?? 0) + 1;
      return result;
    },
    { step: 'initialize', name: 'benchSqsCallCounter' },
  );
  return { snapshot: () => ({ ...counts }) };
}

export function difference(after: SqsCallCounts, before: SqsCallCounts): SqsCallCounts {
  const result: SqsCallCounts = {};
  for (const [name, count] of Object.entries(after)) {
    const delta = count - (before[name] ?? 0);
    if (delta) result[name.replace(/Command/, '')] = delta;
  }
  return result;
}
