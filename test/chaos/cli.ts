import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { redactUrl } from '../../functions/adapters/config.ts';
import { openDatabase } from '../../functions/adapters/database.ts';
import { redactSecrets } from '../../functions/adapters/redact.ts';
import { startDatabaseBridge } from '../../infra/local/db-bridge.ts';
import { type EmbeddedPostgresHandle, startEmbeddedPostgres } from '../../infra/local/embedded-postgres.ts';
import { runChaos } from './engine.ts';
import { silenceEmptyMetricsWarning } from './quiet.ts';
import { writeReport } from './report.ts';
import { scanFunctionsForBuiltSql } from './sql-scan.ts';

/**
 * `npm run chaos -- --seed S --runs N [--concurrency C] [--coverage] [--out DIR]`
 *
 * Runs the chaos suite against a fresh database (in DATABASE_URL's cluster, else an embedded
 * PostgreSQL), prints progress, writes the report (JSON + Markdown) under test/chaos/results/ and
 * exits 1 if any invariant was violated (or the harness itself failed).
 */
const RESULTS_DIR = fileURLToPath(new URL('./results/', import.meta.url));

async function main(): Promise<number> {
  process.env.POWERTOOLS_METRICS_DISABLED ??= 'true';
  silenceEmptyMetricsWarning();
  const { values } = parseArgs({
    options: {
      seed: { type: 'string', default: '20261130' },
      runs: { type: 'string', default: '200' },
      concurrency: { type: 'string', default: '32' },
      coverage: { type: 'boolean', default: false },
      out: { type: 'string', default: RESULTS_DIR },
      'keep-db': { type: 'boolean', default: false },
    },
  });
  const seed = Number(values.seed);
  const runs = Number(values.runs);
  const concurrency = Number(values.concurrency);
  for (const [name, value] of Object.entries({ seed, runs, concurrency })) {
    if (!Number.isSafeInteger(value) || value < (name === 'seed' ? 0 : 1)) {
      console.error(`--${name} must be a ${name === 'seed' ? 'non-negative' : 'positive'} integer`);
      return 2;
    }
  }

  const scan = await scanFunctionsForBuiltSql();
  if (scan.findings.length > 0) {
    console.error('SQL built from template literals outside the reviewed exception:');
    for (const finding of scan.findings) console.error(`  ${finding.file}:${finding.line}  ${finding.text}`);
  }

  let embedded: EmbeddedPostgresHandle | undefined;
  const scratch = await mkdtemp(join(tmpdir(), 'runtime-cleanup-chaos-'));
  let adminUrl = process.env.DATABASE_URL;
  if (!adminUrl) {
    embedded = await startEmbeddedPostgres({ dataDir: join(scratch, 'postgres'), persistent: false });
    adminUrl = embedded.url;
  }
  const bridge = await startDatabaseBridge();
  const admin = await openDatabase({
    url: adminUrl,
    wsProxy: bridge.address,
    maxConnections: 1,
    lockTimeoutMs: 10_000,
    statementTimeoutMs: 60_000,
  });
  // CREATE DATABASE takes no parameters; the name is built here from digits and hex only.
  const name = `rc_chaos_${seed}_${randomBytes(4).toString('hex')}`;
  await admin.query(`CREATE DATABASE ${name}`);
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  console.log(
    `chaos: seed ${seed}, ${runs} runs, ${concurrency} concurrent, database ${redactUrl(url.toString())}`,
  );
  let lastPrint = 0;
  try {
    const result = await runChaos({
      seed,
      runs,
      concurrency,
      databaseUrl: url.toString(),
      wsProxy: bridge.address,
      dataDir: join(scratch, 'stack'),
      coverage: values.coverage,
      onProgress: ({ done, total, violations, elapsedMs }) => {
        if (done !== total && elapsedMs - lastPrint < 5_000) return;
        lastPrint = elapsedMs;
        console.log(
          `chaos: ${done}/${total} runs · ${violations} violation(s) so far · ${(elapsedMs / 1000).toFixed(0)} s`,
        );
      },
    });
    result.security = {
      sqlScan: {
        filesScanned: scan.files,
        sqlBuiltFromText: scan.findings,
        reviewedExceptionsPresent: scan.reviewedExceptionsPresent,
      },
    };
    const written = await writeReport(result, values.out);
    console.log(
      `chaos: done in ${(result.durationMs / 1000).toFixed(1)} s · violations ${result.violations.length} · convergence p50 ${(result.convergence.p50Ms / 1000).toFixed(2)} s, p99 ${(result.convergence.p99Ms / 1000).toFixed(2)} s, max ${(result.convergence.maxMs / 1000).toFixed(2)} s · harness errors ${result.harnessErrors.length}`,
    );
    for (const violation of result.violations.slice(0, 20))
      console.log(`  VIOLATION ${violation.invariant}: ${violation.message}`);
    for (const error of result.harnessErrors.slice(0, 10)) console.log(`  harness error: ${error}`);
    console.log(`chaos: report ${written.markdown}`);
    return result.violations.length === 0 && result.harnessErrors.length === 0 && scan.findings.length === 0
      ? 0
      : 1;
  } finally {
    if (!values['keep-db']) await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => {});
    await admin.end();
    await bridge.close();
    if (embedded) await embedded.stop();
    await rm(scratch, { recursive: true, force: true });
  }
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error(
      `chaos failed: ${redactSecrets(error instanceof Error ? (error.stack ?? error.message) : String(error))}`,
    );
    process.exit(1);
  },
);
