/**
 * `npm run chaos -- --seed S --runs N [--concurrency C] [--coverage] [--out DIR]` (see CHAOS_HELP).
 *
 * Runs the chaos suite against a fresh database (in DATABASE_URL's cluster, else an embedded
 * PostgreSQL), prints progress, writes the report (JSON + Markdown) under test/chaos/results/ and
 * exits 1 if any invariant was violated (or the harness itself failed).
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { redactUrl } from '../../functions/adapters/config.ts';
import { openDatabase } from '../../functions/adapters/database.ts';
import { redactSecrets } from '../../functions/adapters/redact.ts';
import { startDatabaseBridge } from '../../infra/local/db-bridge.ts';
import { startEmbeddedPostgres } from '../../infra/local/embedded-postgres.ts';
import { startupFailureText } from '../../infra/local/errors.ts';
import { suiteDriver } from '../support/suite-driver.ts';
import { CHAOS_HELP, ChaosExitCode, parseChaosCommandLine } from './cli-options.ts';
import { runChaos } from './engine.ts';
import { Invariant } from './invariants.ts';
import { silenceEmptyMetricsWarning } from './quiet.ts';
import { reportBaseName, writeReport } from './report.ts';
import { scanFunctionsForBuiltSql } from './sql-scan.ts';

async function main(): Promise<number> {
  const parsed = parseChaosCommandLine(process.argv.slice(2));
  if (parsed.kind === 'help') {
    process.stdout.write(CHAOS_HELP);
    return ChaosExitCode.OK;
  }
  if (parsed.kind === 'invalid') {
    process.stderr.write(`npm run chaos: ${parsed.message}\n`);
    return ChaosExitCode.USAGE;
  }
  const {
    seed,
    runs,
    concurrency,
    coverage,
    kinds,
    out,
    keepDb,
    reclaimGraceSeconds,
    reclaimMaxSharePercent,
  } = parsed.options;
  // The stack runs in this process: an uncaught error (an 'error' event nobody listened to, a
  // rejection nobody handled) is the stack crashing, invariant P's violation. It still ends the
  // process, as it would a Lambda instance; first it leaves a crash report saying so.
  process.once('uncaughtException', (error) => {
    const message = redactSecrets(
      `the chaos process, which runs the stack, crashed while faults ran: uncaught ${error.name}: ${error.message}`,
    );
    console.error(`  VIOLATION ${Invariant.NO_PROCESS_EXITS}: ${message}`);
    try {
      mkdirSync(out, { recursive: true });
      const file = join(out, `${reportBaseName({ seed, runs })}.crash.md`);
      writeFileSync(
        file,
        `# Chaos report — seed ${seed}, ${runs} runs: CRASHED\n\n**VIOLATION** ${Invariant.NO_PROCESS_EXITS} — ${message}\n\n\`\`\`\n${redactSecrets(error.stack ?? '')}\n\`\`\`\n`,
      );
      console.error(`chaos: crash report ${file}`);
    } catch {}
    process.exit(ChaosExitCode.FAILED);
  });
  process.env.POWERTOOLS_METRICS_DISABLED ??= 'true';
  silenceEmptyMetricsWarning();

  const scan = await scanFunctionsForBuiltSql();
  if (scan.findings.length > 0) {
    console.error('SQL built from template literals outside the reviewed exception:');
    for (const finding of scan.findings) console.error(`  ${finding.file}:${finding.line}  ${finding.text}`);
  }

  // Everything started is stopped in reverse, whichever step fails (a PostgreSQL that did not
  // start must not leave its scratch folder; a database that did must not outlive the run).
  const cleanups: Array<() => Promise<unknown>> = [];
  try {
    const scratch = await mkdtemp(join(tmpdir(), 'runtime-cleanup-chaos-'));
    cleanups.push(() => rm(scratch, { recursive: true, force: true }));
    let adminUrl = process.env.DATABASE_URL;
    if (!adminUrl) {
      const embedded = await startEmbeddedPostgres({ dataDir: join(scratch, 'postgres'), persistent: false });
      cleanups.push(() => embedded.stop());
      adminUrl = embedded.url;
    }
    const bridge = await startDatabaseBridge();
    cleanups.push(() => bridge.close());
    const driver = suiteDriver();
    const admin = await openDatabase({
      url: adminUrl,
      driver,
      wsProxy: bridge.address,
      maxConnections: 1,
      lockTimeoutMs: 10_000,
      statementTimeoutMs: 60_000,
    });
    cleanups.push(() => admin.end());
    // CREATE DATABASE takes no parameters; the name is built here from digits and hex only.
    const name = `rc_chaos_${seed}_${randomBytes(4).toString('hex')}`;
    await admin.query(`CREATE DATABASE ${name}`);
    if (!keepDb) cleanups.push(() => admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`));
    const url = new URL(adminUrl);
    url.pathname = `/${name}`;
    console.log(
      `chaos: seed ${seed}, ${runs} runs, ${concurrency} concurrent, database ${redactUrl(url.toString())}`,
    );
    let lastPrint = 0;
    const result = await runChaos({
      seed,
      runs,
      concurrency,
      databaseUrl: url.toString(),
      driver,
      wsProxy: bridge.address,
      dataDir: join(scratch, 'stack'),
      coverage,
      ...(kinds.length > 0 ? { focus: kinds } : {}),
      // The reclaimer runs beside the fence protocol, as deployed: leaked sandboxes are injected
      // and invariant GC judges every DELETE it sends (reclaim-chaos.ts).
      reclaim: {
        graceSeconds: reclaimGraceSeconds,
        ...(reclaimMaxSharePercent !== undefined ? { maxSharePercent: reclaimMaxSharePercent } : {}),
        onReport: (report) => {
          console.log(
            `chaos: reclaimer: ${report.leaksInjected} leak(s) injected, ${report.leaksReclaimed} reclaimed, ${report.leaksStillLive.length} still live; ${report.reclaimDeletes} reclaim DELETE(s), ${report.ownedChecked} judged against an owning scope`,
          );
        },
      },
      onStage: (stage) => console.log(`chaos: ${stage}`),
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
    const written = await writeReport(result, out);
    console.log(
      `chaos: done in ${(result.durationMs / 1000).toFixed(1)} s · violations ${result.violations.length} · convergence p50 ${(result.convergence.p50Ms / 1000).toFixed(2)} s, p99 ${(result.convergence.p99Ms / 1000).toFixed(2)} s, max ${(result.convergence.maxMs / 1000).toFixed(2)} s · harness errors ${result.harnessErrors.length}`,
    );
    for (const violation of result.violations.slice(0, 20))
      console.log(`  VIOLATION ${violation.invariant}: ${violation.message}`);
    for (const error of result.harnessErrors.slice(0, 10)) console.log(`  harness error: ${error}`);
    console.log(`chaos: report ${written.markdown}`);
    return result.violations.length === 0 && result.harnessErrors.length === 0 && scan.findings.length === 0
      ? ChaosExitCode.OK
      : ChaosExitCode.FAILED;
  } finally {
    for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {});
  }
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error(`chaos failed: ${redactSecrets(startupFailureText(error))}`);
    process.exit(ChaosExitCode.FAILED);
  },
);
