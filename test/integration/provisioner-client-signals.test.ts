/**
 * The provisioner client keeps no AbortSignal of a request once the request has returned. It used
 * to combine the caller's signal with `AbortSignal.timeout(deleteTimeoutMs)` through
 * `AbortSignal.any`, and Node then holds the timeout signal strongly until its timer fires (120 s
 * by default): every release's signals were kept two minutes after its DELETE was answered (600
 * live timeout signals after 600 cleanups in the benchmark's heap). Counted here with
 * `v8.queryObjects`, which counts the live AbortSignals after a full garbage collection, around
 * requests to a real local provisioner.
 */
import { queryObjects } from 'node:v8';
import { afterAll, describe, expect, it } from 'vitest';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import { ReleaseOutcome } from '../../functions/cleanup/types.ts';
import { useLocalProvisionerFixture } from '../support/fixtures.ts';
import { createSandboxAt } from '../support/probes.ts';

const fixture = useLocalProvisionerFixture({ tempPrefix: 'rc-provisioner-signals-' });
let client: ProvisionerClient | undefined;

afterAll(async () => {
  await client?.close();
});

/** The default SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: far longer than the test. */
const DELETE_TIMEOUT_MS = 120_000;
const REQUESTS = 20;

function liveSignals(): number {
  return queryObjects(AbortSignal, { format: 'count' }) as number;
}

/**
 * Live AbortSignals beyond `before` once the requests are over; the provisioner closes its side of
 * each request a turn or two after answering, so a few turns are allowed for that.
 */
async function signalsLeftOver(before: number): Promise<number> {
  let left = liveSignals() - before;
  for (let turn = 0; turn < 20 && left > 0; turn += 1) {
    await new Promise((resolve) => setTimeout(resolve, 10));
    left = liveSignals() - before;
  }
  return left;
}

describe('the provisioner client keeps no signal of a finished request', () => {
  it("DELETEs with the caller's signal (as a release sends them), deleted, absent or refused", async () => {
    client ??= new ProvisionerClient(fixture.provisioner.url);
    const provisioner = fixture.provisioner;
    // The release's own deadline signal, alive for the whole test as it is for a whole release.
    const caller = new AbortController();
    const live = await Promise.all(
      Array.from({ length: REQUESTS }, async (_, index) => {
        const sandboxId = `sbx-signals-${process.pid}-${index}`;
        const generation = await createSandboxAt(provisioner.url, { sandboxId, threadId: 't', uid: 'u' });
        return { sandboxId, generation };
      }),
    );
    const refused = `sbx-signals-${process.pid}-refused`;
    provisioner.setFault(refused, { status: 503 });
    const before = liveSignals();

    for (const { sandboxId, generation } of live) {
      const request = { sandboxId, generation, deleteTimeoutMs: DELETE_TIMEOUT_MS, signal: caller.signal };
      expect(await client.deleteSandbox(request)).toBe(ReleaseOutcome.DELETED);
      // The same DELETE again: 404, the sandbox is gone.
      expect(await client.deleteSandbox(request)).toBe(ReleaseOutcome.ABSENT);
    }
    await expect(
      client.deleteSandbox({
        sandboxId: refused,
        generation: 1,
        deleteTimeoutMs: DELETE_TIMEOUT_MS,
        signal: caller.signal,
      }),
    ).rejects.toMatchObject({ retryable: true });

    expect(await signalsLeftOver(before)).toBe(0);
    expect(caller.signal.aborted).toBe(false);
  });

  it("the reclaimer's listing with the caller's signal", async () => {
    client ??= new ProvisionerClient(fixture.provisioner.url);
    const caller = new AbortController();
    // One listing first: whatever the first request of its kind sets up once is not per request.
    await client.listSandboxes({ timeoutMs: DELETE_TIMEOUT_MS, signal: caller.signal });
    const before = liveSignals();
    for (let i = 0; i < REQUESTS; i += 1) {
      await client.listSandboxes({ timeoutMs: DELETE_TIMEOUT_MS, signal: caller.signal });
    }
    expect(await signalsLeftOver(before)).toBe(0);
  });
});
