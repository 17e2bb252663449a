/**
 * A hostile or odd provisioner listing (a real HTTP server answering GET /api/sandboxes as told):
 * every reply the reclaimer cannot fully trust refuses the run with its reason, records nothing
 * and sends no DELETE, even for sandboxes that are long-leaked by the database's account.
 */
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import { runReclaim } from '../../functions/cleanup/reclaim.ts';
import {
  MAX_LIST_BODY_BYTES,
  ReclaimRefusal,
  ReclaimRefusedError,
} from '../../functions/cleanup/reclaim-listing.ts';
import { SandboxProvider } from '../../functions/cleanup/sandbox-provider.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { rejectionOf } from '../support/probes.ts';

const database = useDatabaseFixture();

interface Reply {
  status: number;
  body: string | Buffer;
  contentType?: string;
  /** Instead of the body: this many bytes of spaces, written as the client reads them. */
  streamBytes?: number;
}
let reply: Reply;
/** What a streamed reply came to: the bytes the client took before it let go. */
let streamed: { written: number; finished: boolean } | undefined;
const requests: string[] = [];
let server: Server;
let client: ProvisionerClient;
let provider: SandboxProvider;

beforeAll(async () => {
  server = createServer((request, response) => {
    requests.push(`${request.method} ${request.url}`);
    // The reply under test is the listing's; a DELETE (only ever sent after a trusted listing) is
    // confirmed as the contract's provisioner confirms it.
    if (request.method === 'DELETE') {
      response.writeHead(200, { 'content-type': 'application/json' }).end('{"deleted":true}');
      return;
    }
    response.writeHead(reply.status, { 'content-type': reply.contentType ?? 'application/json' });
    if (reply.streamBytes === undefined) {
      response.end(reply.body);
      return;
    }
    void streamSpaces(response, reply.streamBytes);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  client = new ProvisionerClient(url);
  provider = new SandboxProvider({ client, releaseLockTimeoutMs: 2_000, provisionerDeleteTimeoutMs: 2_000 });
});
/** Writes `total` bytes a megabyte at a time, each once the client has taken the one before. */
async function streamSpaces(response: ServerResponse, total: number): Promise<void> {
  const state = { written: 0, finished: false };
  streamed = state;
  const chunk = Buffer.alloc(1024 * 1024, 0x20);
  let closed = false;
  // One listener each for the whole stream, waking the write that waits.
  let wake = () => {};
  response.on('close', () => {
    closed = true;
    wake();
  });
  response.on('drain', () => wake());
  while (state.written < total && !closed) {
    const piece = chunk.subarray(0, Math.min(chunk.length, total - state.written));
    const more = response.write(piece);
    state.written += piece.length;
    if (!more && !closed) await new Promise<void>((resolve) => (wake = resolve));
  }
  if (!closed)
    response.end(() => {
      state.finished = true;
    });
}

afterAll(async () => {
  await client?.close();
  await new Promise((resolve) => server?.close(resolve));
});
beforeEach(async () => {
  requests.length = 0;
  // Long-leaked by the database's account (the same generation and URL as the entries below): only
  // the listing stands between them and a DELETE.
  await database.t.db.query('DELETE FROM runtime_reclaim_sightings');
  await database.t.db.query(
    `INSERT INTO runtime_reclaim_sightings (sandbox_id, listed_generation, listed_identity, first_seen_at)
     SELECT id, 1, '["http://x/' || id || '",null]', now() - interval '1 day'
     FROM unnest(ARRAY['sbx-a', 'sbx-b']) AS id`,
  );
});

const entry = (id: string, extra: Record<string, unknown> = {}) => ({
  sandbox_id: id,
  sandbox_url: `http://x/${id}`,
  status: 'running',
  generation: 1,
  ...extra,
});

const HOSTILE: Array<{ name: string; reply: Reply; reason: string }> = [
  {
    name: 'an HTML page from a catch-all server',
    reply: { status: 200, body: '<html>hi</html>', contentType: 'text/html' },
    reason: ReclaimRefusal.LIST_NOT_JSON,
  },
  { name: 'an empty body', reply: { status: 200, body: '' }, reason: ReclaimRefusal.LIST_NOT_JSON },
  { name: 'a JSON array', reply: { status: 200, body: '[]' }, reason: ReclaimRefusal.LIST_BAD_SHAPE },
  {
    name: 'no sandboxes array',
    reply: { status: 200, body: '{"count":0}' },
    reason: ReclaimRefusal.LIST_BAD_SHAPE,
  },
  {
    name: 'sandboxes as an object',
    reply: { status: 200, body: '{"sandboxes":{}}' },
    reason: ReclaimRefusal.LIST_BAD_SHAPE,
  },
  {
    name: 'an entry without sandbox_id',
    reply: { status: 200, body: JSON.stringify({ sandboxes: [{ status: 'running' }], count: 1 }) },
    reason: ReclaimRefusal.LIST_BAD_ENTRY,
  },
  {
    name: 'a dot-segment sandbox id',
    reply: { status: 200, body: JSON.stringify({ sandboxes: [entry('..')], count: 1 }) },
    reason: ReclaimRefusal.LIST_BAD_ENTRY,
  },
  {
    name: 'a negative generation',
    reply: {
      status: 200,
      body: JSON.stringify({ sandboxes: [entry('sbx-c', { generation: -1 })], count: 1 }),
    },
    reason: ReclaimRefusal.LIST_BAD_ENTRY,
  },
  {
    name: 'a fractional generation',
    reply: {
      status: 200,
      body: JSON.stringify({ sandboxes: [entry('sbx-c', { generation: 1.5 })], count: 1 }),
    },
    reason: ReclaimRefusal.LIST_BAD_ENTRY,
  },
  {
    name: 'one id twice',
    reply: { status: 200, body: JSON.stringify({ sandboxes: [entry('sbx-c'), entry('sbx-c')], count: 2 }) },
    reason: ReclaimRefusal.LIST_DUPLICATE,
  },
  {
    name: 'a count above the entries (a page of a paginated listing)',
    reply: { status: 200, body: JSON.stringify({ sandboxes: [entry('sbx-c')], count: 500 }) },
    reason: ReclaimRefusal.LIST_COUNT_MISMATCH,
  },
  { name: 'a 503', reply: { status: 503, body: 'busy' }, reason: ReclaimRefusal.LIST_UNAVAILABLE },
  {
    name: 'a 404 (a provisioner without the list endpoint)',
    reply: { status: 404, body: '{}' },
    reason: ReclaimRefusal.LIST_REJECTED,
  },
];

function run(overrides: { listTimeoutMs?: number } = {}) {
  return runReclaim(
    { db: database.t.db, provider, lister: client, provisioner: 'http://provisioner.test' },
    {
      graceSeconds: 60,
      maxPerRun: 50,
      maxSharePercent: 100,
      runtimeCleanupTimeoutMs: 5_000,
      provisionerDeleteTimeoutSeconds: 2,
      lockTimeoutMs: 2_000,
      listTimeoutMs: 2_000,
      ...overrides,
    },
  );
}

async function sightings(): Promise<string[]> {
  const { rows } = await database.t.db.query<{ sandbox_id: string }>(
    'SELECT sandbox_id FROM runtime_reclaim_sightings ORDER BY sandbox_id',
  );
  return rows.map((row) => row.sandbox_id);
}

describe('a listing the reclaimer cannot trust refuses the run: nothing recorded, nothing deleted', () => {
  it.each(HOSTILE)('$name → $reason', async ({ reply: hostile, reason }) => {
    reply = hostile;
    const error = await rejectionOf(run());
    expect(error).toBeInstanceOf(ReclaimRefusedError);
    expect((error as ReclaimRefusedError).reason).toBe(reason);
    expect(requests).toEqual(['GET /api/sandboxes']);
    expect(await sightings()).toEqual(['sbx-a', 'sbx-b']);
  });

  it(`a reply larger than ${MAX_LIST_BODY_BYTES} bytes is not read to its end`, async () => {
    // Twice the limit, streamed as read: more than any socket buffers between the two could hold,
    // so a client that read it to its end would let the server finish.
    reply = { status: 200, body: '', streamBytes: 2 * MAX_LIST_BODY_BYTES };
    streamed = undefined;
    // 32 MB through a loopback socket: on a loaded machine more than the 2 s the other cases get,
    // and a timeout (list_unavailable) would hide whether the size limit works.
    const error = await rejectionOf(run({ listTimeoutMs: 30_000 }));
    expect((error as ReclaimRefusedError).reason).toBe(ReclaimRefusal.LIST_TOO_LARGE);
    expect(requests).toEqual(['GET /api/sandboxes']);
    // Set by the server as it wrote (TypeScript narrowed it to the undefined assigned above).
    const seen = streamed as typeof streamed | { written: number; finished: boolean };
    expect(seen?.finished).toBe(false);
    expect(seen?.written).toBeLessThan(2 * MAX_LIST_BODY_BYTES);
  });

  it('a well-formed listing of the same server is acted on (the refusals above are about the reply)', async () => {
    reply = { status: 200, body: JSON.stringify({ sandboxes: [entry('sbx-a'), entry('sbx-b')], count: 2 }) };
    const report = await run();
    expect(report.reclaimed).toBe(2);
    expect(requests.sort()).toEqual([
      'DELETE /api/sandboxes/sbx-a?generation=1',
      'DELETE /api/sandboxes/sbx-b?generation=1',
      'GET /api/sandboxes',
    ]);
  });

  it('a listing without generation and without count (the platform provisioner today) is accepted', async () => {
    reply = {
      status: 200,
      body: JSON.stringify({ sandboxes: [{ sandbox_id: 'sbx-a', sandbox_url: 'u', status: 'running' }] }),
    };
    const report = await run();
    expect(report.listed).toBe(1);
    expect(report.classified[0]).toMatchObject({
      sandboxId: 'sbx-a',
      generation: null,
      generationGuessed: true,
    });
    // Its streak had a generation; a listing without one is another sandbox as far as the streak
    // knows: it starts again, and nothing is deleted yet.
    expect(report.reclaimed).toBe(0);
    expect(requests).toEqual(['GET /api/sandboxes']);
  });
});
