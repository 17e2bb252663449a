/**
 * Strings the operator CLI prints come from the database (run ids, scopes, sandbox ids, reasons,
 * actors), so from whoever can write there. A hostile one must not drive the operator's terminal:
 * ANSI escape sequences, carriage returns, backspaces, C1 controls and bidirectional overrides
 * are printed as escapes in every human-readable output, and a line break inside a value does not
 * start a line of its own. `--json` stays JSON and gives back the exact strings.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../../infra/local/embedded-postgres.ts';
import type { ChildRun } from '../support/child-process.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { insertConversation, insertRun, upsertSandbox } from '../support/factories.ts';
import { runOpsCli } from '../support/ops-cli.ts';

/** Clears the screen, homes the cursor, rewrites the line, and a C1 CSI, and a fake next line. */
const HOSTILE = '\u001b[2J\u001b[H\rOK\b\b\u009b31m\u202eevil\nFENCE CLEARED';
// biome-ignore lint/suspicious/noControlCharactersInRegex: finding raw control characters is the point.
const RAW_CONTROLS = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/;

let t: TestDatabase;
let runId: string;
let sqsEndpoint: string;

beforeAll(async () => {
  t = await createTestDatabase();
  sqsEndpoint = `http://127.0.0.1:${await freePort()}`;
  const uid = `user-${HOSTILE}`;
  const runtimeScopeId = `scope-${randomUUID().slice(0, 8)}${HOSTILE}`;
  const conversation = await insertConversation(t.db, { uid });
  await upsertSandbox(t.db, { uid, runtimeScopeId, sandboxId: `sbx-${HOSTILE}`, generation: 3 });
  runId = await insertRun(t.db, {
    id: `run-${randomUUID().slice(0, 8)}${HOSTILE}`,
    uid,
    conversationId: conversation.id,
    threadId: conversation.threadId,
    runtimeScopeId,
    status: 'completed',
    fence: true,
  });
  await t.db.query(
    `INSERT INTO runtime_cleanup_overrides (run_id, uid, runtime_scope_id, sandbox_id, generation, reason, actor)
     VALUES ($1::text, $2::text, $3::text, $4::text, 3, $5::text, $6::text)`,
    [runId, uid, runtimeScopeId, `sbx-${HOSTILE}`, `reason ${HOSTILE}`, `actor ${HOSTILE}`],
  );
});
afterAll(async () => {
  await t?.drop();
});

function ops(args: string[]): Promise<ChildRun> {
  const env: NodeJS.ProcessEnv = {
    DATABASE_URL: t.url,
    DATABASE_WS_PROXY: t.wsProxy,
    // Nothing listens: explain shows the database half and says the dead letters are unknown.
    AWS_ENDPOINT_URL_SQS: sqsEndpoint,
    QUEUE_NAME_PREFIX: '',
  };
  return runOpsCli(args, { env, timeoutMs: 30_000 });
}

function expectNoRawControls(run: ChildRun): void {
  for (const [stream, text] of [
    ['stdout', run.stdout],
    ['stderr', run.stderr],
  ] as const) {
    expect(RAW_CONTROLS.test(text), `${stream}: ${JSON.stringify(text)}`).toBe(false);
    // The value's line break is shown as \n, not obeyed: no line starts with the forged text.
    expect(
      text.split('\n').some((line) => line.startsWith('FENCE CLEARED')),
      stream,
    ).toBe(false);
  }
}

describe('ops human-readable output with hostile strings from the database', () => {
  it.each([
    ['fences', ['fences']],
    ['fences --history', ['fences', '--history']],
  ])('%s escapes every control character', async (_name, args) => {
    const run = await ops(args);
    expect(run.code, run.stderr).toBe(0);
    expectNoRawControls(run);
    expect(run.stdout).toContain('\\u001b[2J\\u001b[H\\rOK\\b\\b\\u009b31m\\u202eevil\\nFENCE CLEARED');
  });

  it('explain escapes them in every line, the diagnosis and the warning included', async () => {
    const run = await ops(['explain', runId]);
    // 3: the dead-letter queues could not be read; the database half is printed all the same.
    expect(run.code, run.stderr).toBe(3);
    expectNoRawControls(run);
    expect(run.stdout).toContain('Run run-');
    expect(run.stdout).toContain('\\u001b[2J');
    expect(run.stdout).toContain('reason \\u001b[2J');
  });

  it('a failure that quotes the run id escapes it too', async () => {
    const run = await ops(['force-clear', `${runId}-missing`, '--reason', 'x']);
    expect(run.code).not.toBe(0);
    expectNoRawControls(run);
  });
});

describe('ops --json with hostile strings', () => {
  it('stays JSON, gives back the exact strings, and carries no raw control character', async () => {
    for (const args of [['fences'], ['fences', '--history'], ['explain', runId]]) {
      const run = await ops([...args, '--json']);
      expect(RAW_CONTROLS.test(run.stdout), JSON.stringify(run.stdout)).toBe(false);
      // Parses, and holds the run id exactly as stored.
      expect(JSON.stringify(JSON.parse(run.stdout)), args.join(' ')).toContain(JSON.stringify(runId));
    }
    const fences = JSON.parse((await ops(['fences', '--json'])).stdout) as {
      fences: Array<{ runId: string }>;
    };
    expect(fences.fences.map((fence) => fence.runId)).toContain(runId);
  });
});
