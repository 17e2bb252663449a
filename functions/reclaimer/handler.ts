import type { Context } from 'aws-lambda';
import { type CleanupConfig, requireProvisionerUrl } from '../adapters/config.ts';
import type { Database } from '../adapters/database.ts';
import { deployedInfrastructure } from '../adapters/deployed-infrastructure.ts';
import type { ComposedFunction, Infrastructure } from '../adapters/infrastructure.ts';
import { lambdaEntry } from '../adapters/lambda.ts';
import { MetricName } from '../adapters/metric-names.ts';
import type { Telemetry } from '../adapters/observability.ts';
import { openProvisionerClient } from '../adapters/open-provisioner.ts';
import { isCleanupError } from '../cleanup/errors.ts';
import {
  provisionerIdentity,
  type ReclaimEvent,
  type ReclaimReport,
  type ReclaimSettings,
  refusalReason,
  runReclaim,
  type SandboxLister,
} from '../cleanup/reclaim.ts';
import { ReclaimRefusedError } from '../cleanup/reclaim-listing.ts';
import { SandboxProvider } from '../cleanup/sandbox-provider.ts';

/**
 * Time kept back from the Lambda deadline after the last DELETE may start: that DELETE's whole
 * bound, plus this, for ending its records and reporting.
 */
export const REPORT_MARGIN_MS = 10_000;

/**
 * The reclaimer's settings from the configuration (shared with `ops orphans` and `ops reclaim`).
 * `recordAs`: the deployment's own reclaimer records them as the settings of record, which no
 * caller's guard may go below (an operator's tool leaves it unset).
 */
export function reclaimSettings(
  config: CleanupConfig,
  recordAs?: string,
): ReclaimSettings & { listTimeoutMs: number } {
  return {
    ...(recordAs ? { recordAs } : {}),
    graceSeconds: config.reclaimGraceSeconds,
    maxPerRun: config.reclaimMaxPerRun,
    maxSharePercent: config.reclaimMaxSharePercent,
    runtimeCleanupTimeoutMs: config.runtimeCleanupTimeoutSeconds * 1000,
    provisionerDeleteTimeoutSeconds: config.provisionerDeleteTimeoutSeconds,
    lockTimeoutMs: config.databaseLockTimeoutMs,
    // The listing is bounded like a delete: one request to the same service.
    listTimeoutMs: config.provisionerDeleteTimeoutSeconds * 1000,
  };
}

/** Logs and counts each decision of a run as it is made: every reclaim with its sandbox, scope and why. */
export function reportReclaimEvent(telemetry: Telemetry, event: ReclaimEvent): void {
  const { sandbox } = event;
  const owner = sandbox.owners[0];
  const facts = {
    phase: 'reclaim',
    sandboxId: sandbox.sandboxId,
    listedGeneration: sandbox.generation,
    ...(owner ? { uid: owner.uid, runtimeScopeId: owner.runtimeScopeId } : {}),
    leakReason: sandbox.reason,
    seenLeakedSince: sandbox.firstSeenAt?.toISOString() ?? null,
  };
  switch (event.kind) {
    case 'reclaimed':
      telemetry.logger.info('leaked sandbox reclaimed', {
        ...facts,
        outcome: event.outcome,
        deletedGeneration: event.generation,
      });
      if (event.settleError !== undefined) {
        telemetry.logger.warn('could not end the reclaim records; they end at their deadlines', {
          ...facts,
          error: event.settleError instanceof Error ? event.settleError.message : String(event.settleError),
        });
      }
      telemetry.count(MetricName.SANDBOXES_RECLAIMED, { reason: sandbox.reason ?? 'unknown' });
      return;
    case 'skipped':
      telemetry.logger.info('leaked sandbox kept: its scope holds it now', {
        ...facts,
        verdict: event.verdict,
        holdingUid: event.uid,
        holdingRuntimeScopeId: event.runtimeScopeId,
      });
      telemetry.count(MetricName.RECLAIM_REFUSED, { reason: event.verdict });
      return;
    case 'unconfirmed':
      telemetry.logger.warn('leaked sandbox not confirmed gone', { ...facts, why: event.why });
      telemetry.count(MetricName.RECLAIM_REFUSED, { reason: 'unconfirmed' });
      return;
    case 'failed': {
      const error = event.error;
      telemetry.logger.warn('leaked sandbox reclaim failed; tried again next run', {
        ...facts,
        errorCode: isCleanupError(error) ? error.code : undefined,
        error: error instanceof Error ? error.message : String(error),
        // The DELETE may still act: the scope and the id stay quarantined until it cannot.
        quarantined: event.quarantined,
      });
      telemetry.count(MetricName.RECLAIM_REFUSED, { reason: 'delete_failed' });
      return;
    }
  }
}

export type ReclaimerResult =
  | (Omit<ReclaimReport, 'classified' | 'leaked' | 'due' | 'settings'> & {
      leaked: number;
      due: number;
      settingsTightened: string[];
      refused?: undefined;
    })
  | { refused: string; message: string };

/** Logs and counts what a whole run decided beyond its deletes: settings tightened, a brake lifted. */
export function reportReclaimRun(
  telemetry: Telemetry,
  report: Pick<ReclaimReport, 'brakeLifted' | 'settings'>,
): void {
  if (report.settings.tightened.length > 0) {
    telemetry.logger.warn("reclaim settings tightened to the deployment's settings of record", {
      phase: 'reclaim',
      tightened: report.settings.tightened,
      recorded: report.settings.recorded,
    });
  }
  if (report.brakeLifted) {
    telemetry.logger.warn(
      'reclaim brake lifted: a recent healthy listing of this provisioner vouches for the pairing',
      {
        phase: 'reclaim',
        brake: report.brakeLifted.brake,
        pairedAt: report.brakeLifted.pairedAt,
      },
    );
    telemetry.count(MetricName.RECLAIM_BRAKE_LIFTED, { brake: report.brakeLifted.brake });
  }
}

/**
 * reclaimer: on a schedule, lists the provisioner's sandboxes and deletes those no scope has owned
 * for the grace (functions/cleanup/reclaim.ts). A refused run (a listing it cannot trust, or a
 * runaway share) deletes nothing, says why and is counted for the alarm; it is not an invocation
 * error, since retrying it at once would find the same listing. As the deployment's own reclaimer
 * it records its settings as the settings of record at every run.
 */
export function createReclaimerHandler(deps: {
  db: Database;
  provider: SandboxProvider;
  lister: SandboxLister;
  /** The provisioner's identity for the pairing evidence (`provisionerIdentity`). */
  provisioner: string;
  telemetry: Telemetry;
  config: CleanupConfig;
}): (event: unknown, context: Context) => Promise<ReclaimerResult> {
  const { telemetry, config } = deps;
  const settings = reclaimSettings(config, 'reclaimer');
  return async (_event, context) => {
    const remaining = context?.getRemainingTimeInMillis?.();
    const startDeletesBeforeMs =
      remaining === undefined
        ? undefined
        : Date.now() + remaining - settings.runtimeCleanupTimeoutMs - REPORT_MARGIN_MS;
    let report: ReclaimReport;
    try {
      report = await runReclaim(
        {
          db: deps.db,
          provider: deps.provider,
          lister: deps.lister,
          provisioner: deps.provisioner,
          onEvent: (event) => reportReclaimEvent(telemetry, event),
        },
        { ...settings, ...(startDeletesBeforeMs !== undefined ? { startDeletesBeforeMs } : {}) },
      );
    } catch (error) {
      if (!(error instanceof ReclaimRefusedError)) throw error;
      telemetry.logger.error('reclaim run refused: nothing recorded, nothing deleted', {
        phase: 'reclaim',
        reason: error.reason,
        error: error.message,
        ...error.details,
      });
      telemetry.count(MetricName.RECLAIM_REFUSED, { reason: refusalReason(error) });
      telemetry.metrics.addMetric(MetricName.RECLAIM_REFUSED, 'Count', 1);
      return { refused: error.reason, message: error.message };
    }
    reportReclaimRun(telemetry, report);
    telemetry.metrics.addMetric(MetricName.RECLAIM_REFUSED, 'Count', 0);
    telemetry.metrics.addMetric(MetricName.SANDBOXES_LISTED, 'Count', report.listed);
    telemetry.metrics.addMetric(MetricName.SANDBOXES_LEAKED, 'Count', report.leaked.length);
    telemetry.metrics.addMetric(MetricName.OLDEST_LEAK_AGE, 'Seconds', report.oldestLeakAgeSeconds);
    const log = report.failed
      ? telemetry.logger.warn.bind(telemetry.logger)
      : telemetry.logger.info.bind(telemetry.logger);
    log('reclaim finished', {
      phase: 'reclaim',
      listed: report.listed,
      leaked: report.leaked.length,
      due: report.due.length,
      reclaimed: report.reclaimed,
      kept: report.skipped,
      failed: report.failed,
      deferred: report.deferred,
      oldestLeakAgeSeconds: report.oldestLeakAgeSeconds,
    });
    const { classified: _classified, settings: ofRecord, ...rest } = report;
    return {
      ...rest,
      leaked: report.leaked.length,
      due: report.due.length,
      settingsTightened: ofRecord.tightened,
    };
  };
}

/** The composition root: the database and the provisioner (list and delete), nothing else. */
export async function composeReclaimer(
  infrastructure: Infrastructure,
): Promise<ComposedFunction<unknown, ReclaimerResult>> {
  const { config } = infrastructure;
  const telemetry = infrastructure.telemetry('reclaimer');
  const client = await openProvisionerClient(infrastructure, telemetry);
  const db = await infrastructure.database('reclaimer', telemetry);
  const provider = new SandboxProvider({
    client,
    releaseLockTimeoutMs: config.releaseLockTimeoutSeconds * 1000,
    provisionerDeleteTimeoutMs: config.provisionerDeleteTimeoutSeconds * 1000,
  });
  const handler = createReclaimerHandler({
    config,
    db,
    provider,
    lister: client,
    provisioner: provisionerIdentity(requireProvisionerUrl(config)),
    telemetry,
  });
  return { handler, telemetry, close: () => provider.close() };
}

export const handler = lambdaEntry(() => composeReclaimer(deployedInfrastructure()));
