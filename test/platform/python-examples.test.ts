/**
 * The Python examples of docs/adopting.md (examples/python/), run as the adopting team would run
 * them: Debian's python3 with psycopg2 and boto3, against the worked example's adopted database
 * (examples/adoption/: the platform's own schema, adopt.sql, then the stack's migrations), the
 * local stack's real handlers and SQS emulator, and a FastAPI provisioner that reports no
 * generation. The database's default isolation is REPEATABLE READ, so every step that must run at
 * READ COMMITTED shows that it asks for it itself.
 */
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { announceRunFinished } from '../../functions/adapters/publish.ts';
import { QueueName } from '../../functions/adapters/queues.ts';
import { adoptionScript, finishRun, sandboxIdOf } from '../support/adopted-platform.ts';
import { runChild } from '../support/child-process.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { fenceOf } from '../support/factories.ts';
import {
  type FastApiProvisioner,
  PYTHON,
  requirePythonModules,
  startFastApiProvisioner,
} from '../support/fastapi-provisioner.ts';
import { rejectionOf } from '../support/probes.ts';
import { letTimePass } from '../support/reclaim-time.ts';
import { type SqsQueryProtocolAdapter, startSqsQueryProtocolAdapter } from '../support/sqs-query-protocol.ts';
import { eventually, fencesCleared, startTestStack, type TestStack } from '../support/stack.ts';

const EXAMPLES = fileURLToPath(new URL('../../examples/python/', import.meta.url));
const USER = 'user-py';
const REFUSED = 2;
const BLOCKED = 3;
const TRY_AGAIN_LATER = 75;

let t: TestDatabase;
let app: FastApiProvisioner;
let stack: TestStack;
let sqs: SqsQueryProtocolAdapter;
let threads = 0;

beforeAll(async () => {
  await requirePythonModules(['boto3', 'psycopg2'], ['python3-boto3', 'python3-psycopg2']);
  t = await createTestDatabase({ empty: true });
  await t.db.query(await adoptionScript('platform-schema'));
  await t.db.query(await adoptionScript('adopt'));
  await t.setDefaultIsolation('repeatable read');
  app = await startFastApiProvisioner();
  stack = await startTestStack(t, { env: { SANDBOX_PROVISIONER_URL: app.url }, stack: { reclaimer: false } });
  sqs = await startSqsQueryProtocolAdapter(stack.sqsEndpoint);
});
afterAll(async () => {
  await sqs?.close();
  await stack?.stop();
  await app?.stop();
  await t?.drop();
});

/**
 * One example script on Debian's interpreter: -E -s (no PYTHON* variables, no user site-packages,
 * so the packages under test are Debian's) without -I, which would drop the script's own folder,
 * where its module is, from the path.
 */
async function python(
  script: string,
  args: string[],
): Promise<{ code: number | null; out: Record<string, unknown> }> {
  const run = await runChild(PYTHON, ['-E', '-s', '-B', script, ...args], {
    cwd: EXAMPLES,
    env: {
      PATH: process.env.PATH,
      DATABASE_URL: t.url,
      SANDBOX_PROVISIONER_URL: app.url,
      AWS_ENDPOINT_URL_SQS: sqs.url,
      AWS_DEFAULT_REGION: 'us-east-1',
      AWS_ACCESS_KEY_ID: 'local',
      AWS_SECRET_ACCESS_KEY: 'local',
    },
    timeoutMs: 30_000,
  });
  const last = run.stdout.trim().split('\n').at(-1) ?? '';
  if (!last.startsWith('{')) throw new Error(`${script} printed no JSON (exit ${run.code}): ${run.stderr}`);
  return { code: run.code, out: JSON.parse(last) as Record<string, unknown> };
}

/** A thread of the platform's own (the runs' foreign key needs it). */
async function newThread(): Promise<string> {
  threads += 1;
  const id = `thread-py-${threads}`;
  await t.db.query(
    'INSERT INTO threads (id, user_id, project_id) VALUES ($1::text, $2::text, gen_random_uuid())',
    [id, USER],
  );
  return id;
}

const admit = (runId: string, threadId: string) =>
  python('admit_run.py', ['--run-id', runId, '--user-id', USER, '--thread-id', threadId]);
const finish = (runId: string, status?: string) =>
  python('finish_run.py', ['--run-id', runId, ...(status === undefined ? [] : ['--status', status])]);

describe('admit_run.py and finish_run.py, through the local stack', () => {
  it('runs where a statement left at the default isolation could not ask runtime_cleanup_blocked', async () => {
    const refusal = await rejectionOf(t.db.query("SELECT runtime_cleanup_blocked('u', 't')"));
    expect((refusal as { code?: string }).code).toBe('25000');
  });

  it('admits, creates and records the sandbox; the finished run is announced and cleaned up', async () => {
    const thread = await newThread();

    const admitted = await admit('run-py-1', thread);
    expect(admitted).toEqual({
      code: 0,
      out: { runId: 'run-py-1', admitted: true, sandboxId: sandboxIdOf(thread), generation: 1 },
    });
    expect(await app.sandboxIds()).toContain(sandboxIdOf(thread));

    const finished = await finish('run-py-1');
    expect(finished.code).toBe(0);
    expect(finished.out).toMatchObject({ runId: 'run-py-1', fenced: true, messageId: expect.any(String) });
    await fencesCleared(t.db, ['run-py-1']);

    expect(await app.sandboxIds()).not.toContain(sandboxIdOf(thread));
    const cleaned = await eventually('runtime-cleaned for the run', async () =>
      (await stack.drain(QueueName.RUNTIME_CLEANED))
        .map((message) => JSON.parse(message.Body!) as { runId: string })
        .find((body) => body.runId === 'run-py-1'),
    );
    expect(cleaned).toMatchObject({ uid: USER, runtimeScopeId: thread, generation: 1 });
  });

  it('refuses a run while the thread is fenced; admits it once cleaned, the generation counted one up', async () => {
    const thread = await newThread();
    expect((await admit('run-py-2', thread)).code).toBe(0);
    // Finished without the announcement yet: the fence is up and stays up.
    expect(await finishRun(t.db, 'run-py-2')).toBe(true);

    const refused = await admit('run-py-3', thread);
    expect(refused).toEqual({ code: BLOCKED, out: { runId: 'run-py-3', admitted: false } });
    const { rows } = await t.db.query("SELECT id FROM agent_runs WHERE id = 'run-py-3'");
    expect(rows).toEqual([]);

    await announceRunFinished(stack.queues, 'run-py-2');
    await fencesCleared(t.db, ['run-py-2']);
    const next = await admit('run-py-3', thread);
    // The provisioner reports no generation: the platform's own counter, one up per record.
    expect(next).toEqual({
      code: 0,
      out: { runId: 'run-py-3', admitted: true, sandboxId: sandboxIdOf(thread), generation: 2 },
    });
  });

  it("a subagent's run raises no fence and is not announced", async () => {
    const thread = await newThread();
    expect((await admit('run-py-parent', thread)).code).toBe(0);
    await t.db.query(
      `INSERT INTO agent_runs (id, user_id, thread_id, parent_run_id, status)
       VALUES ('run-py-child', $1::text, $2::text, 'run-py-parent', 'running')`,
      [USER, thread],
    );

    expect(await finish('run-py-child')).toEqual({ code: 0, out: { runId: 'run-py-child', fenced: false } });
    expect(await fenceOf(t.db, 'run-py-child')).toBe(false);
  });

  it('psycopg2 reads the converted times as aware datetimes: compare them with an aware now', async () => {
    const script = [
      'import datetime, os, psycopg2',
      'conn = psycopg2.connect(os.environ["DATABASE_URL"])',
      'cur = conn.cursor()',
      'cur.execute("SELECT created_at FROM agent_runs ORDER BY created_at LIMIT 1")',
      'created = cur.fetchone()[0]',
      'age = datetime.datetime.now(datetime.timezone.utc) - created',
      'print(created.tzinfo is not None, 0 <= age.total_seconds() < 600)',
    ].join('\n');
    const run = await runChild(PYTHON, ['-I', '-B', '-c', script], {
      cwd: EXAMPLES,
      env: { PATH: process.env.PATH, DATABASE_URL: t.url },
      timeoutMs: 30_000,
    });
    expect(run.stdout.trim()).toBe('True True');
  });

  it('exits 75 when the record is refused while a reclaim may still delete the sandbox', async () => {
    const thread = await newThread();
    const sandboxId = sandboxIdOf(thread);
    // What the reclaim guard lays before its DELETE: every record of the id refused until then.
    await t.db.query(
      `INSERT INTO runtime_reclaim_tombstones (sandbox_id, token, refuse_all_until, expires_at)
       VALUES ($1::text, 'reclaim-attempt', now() + interval '1 minute', now() + interval '1 minute')`,
      [sandboxId],
    );

    const refused = await admit('run-py-4', thread);
    expect(refused.code).toBe(TRY_AGAIN_LATER);
    expect(refused.out).toMatchObject({ runId: 'run-py-4', admitted: true });
    expect(String(refused.out.refused)).toContain(`sandbox ${sandboxId} is being reclaimed`);
    const { rows } = await t.db.query('SELECT 1 FROM sandbox_runtimes WHERE sandbox_id = $1::text', [
      sandboxId,
    ]);
    expect(rows).toEqual([]);

    // "Record again later": the same command, once the refusal's time has passed, admits the run
    // it admitted before (still active, no sandbox) and records its sandbox. It used to fail on
    // the run id's primary key and leave the orphan active run holding the thread.
    await letTimePass(t.db, 61);
    const retried = await admit('run-py-4', thread);
    expect(retried).toEqual({
      code: 0,
      out: { runId: 'run-py-4', admitted: true, sandboxId, generation: 1 },
    });
    const runs = await t.db.query('SELECT status FROM agent_runs WHERE id = $1::text', ['run-py-4']);
    expect(runs.rows).toEqual([{ status: 'running' }]);
  });

  it('admitting again under a run id of another thread is refused, the run left where it is', async () => {
    const thread = await newThread();
    const other = await newThread();
    expect((await admit('run-py-5', thread)).code).toBe(0);

    const refused = await admit('run-py-5', other);
    expect(refused.code).toBe(REFUSED);
    expect(refused.out).toMatchObject({ runId: 'run-py-5', admitted: false });
    const { rows } = await t.db.query('SELECT thread_id FROM agent_runs WHERE id = $1::text', ['run-py-5']);
    expect(rows).toEqual([{ thread_id: thread }]);
    expect(await app.sandboxIds()).not.toContain(sandboxIdOf(other));
  });

  it('finish_run.py refuses a status the database does not count as terminal, and raises no fence', async () => {
    const thread = await newThread();
    expect((await admit('run-py-6', thread)).code).toBe(0);

    const refused = await finish('run-py-6', 'paused');
    expect(refused.code).toBe(REFUSED);
    expect(refused.out).toMatchObject({ runId: 'run-py-6', fenced: false });
    expect(String(refused.out.refused)).toContain("'paused' is not terminal");
    const { rows } = await t.db.query(
      'SELECT status, runtime_cleanup_pending AS fenced, finished_at FROM agent_runs WHERE id = $1::text',
      ['run-py-6'],
    );
    expect(rows).toEqual([{ status: 'running', fenced: false, finished_at: null }]);

    expect(await finish('run-py-6', 'interrupted')).toMatchObject({ code: 0, out: { fenced: true } });
    await fencesCleared(t.db, ['run-py-6']);
  });
});
