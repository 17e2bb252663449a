/**
 * `reclaim --yes`: one reclaim run now, exactly as the scheduled reclaimer does it (the same
 * streaks, grace, guard, bounds and client). Without `--yes` it is `orphans`: nothing is changed.
 */
import { MetricName } from '../../../functions/adapters/metric-names.ts';
import {
  planOrphans,
  type ReclaimEvent,
  runReclaim,
  settingsOfRecord,
  unrecordedSettings,
} from '../../../functions/cleanup/reclaim.ts';
import { ReclaimRefusedError } from '../../../functions/cleanup/reclaim-listing.ts';
import { SandboxProvider } from '../../../functions/cleanup/sandbox-provider.ts';
import {
  reclaimSettings,
  reportReclaimEvent,
  reportReclaimRun,
} from '../../../functions/reclaimer/handler.ts';
import type { Command } from '../command.ts';
import { NoSettingsOfRecordError } from '../errors.ts';
import { ExitCode } from '../exit-codes.ts';
import { plural } from '../format.ts';
import {
  opsProvisioner,
  orphanView,
  refusedOutput,
  renderOrphans,
  renderSettings,
  settingsView,
} from './orphans.ts';

function eventLine(event: ReclaimEvent): string {
  const { sandboxId, reason } = event.sandbox;
  switch (event.kind) {
    case 'reclaimed':
      return `  reclaimed ${sandboxId} generation ${event.generation} (${reason}): ${event.outcome}`;
    case 'skipped':
      return `  kept      ${sandboxId}: ${event.verdict}${event.runtimeScopeId ? ` (${event.uid}/${event.runtimeScopeId})` : ''}`;
    case 'unconfirmed':
      return `  unconfirmed ${sandboxId}: ${event.why}`;
    case 'failed':
      return `  failed    ${sandboxId}: ${event.error instanceof Error ? event.error.message : String(event.error)}`;
  }
}

export const reclaimCommand: Command = {
  name: 'reclaim',
  arguments: [],
  summary: 'run the reclaimer now: delete the leaked sandboxes that are due (dry run unless --yes)',
  details:
    'Deletes only what a scheduled run would: leaked on listings at least RECLAIM_GRACE_SECONDS apart, its scope idle\n' +
    'that long, at most RECLAIM_MAX_PER_RUN, each behind the reclaim guard. Exit 4 when a DELETE failed (try again).\n' +
    "Applies the deployment's settings of record where they are stricter than this shell's. With --yes it refuses\n" +
    '(exit 1, NO_SETTINGS_OF_RECORD) where the deployment has recorded none (its reclaimer has not run in this\n' +
    "database yet), unless --settings-from-environment says to act on this shell's RECLAIM_* settings, which it prints.",
  options: {
    yes: { type: 'boolean', description: 'do it; without this flag nothing is changed (as orphans)' },
    'settings-from-environment': {
      type: 'boolean',
      description:
        "with --yes where the deployment has recorded no settings: act on this shell's grace and bounds",
    },
  },
  async run(input, context) {
    const db = await context.database();
    const { client, identity } = await opsProvisioner(context);
    // Never recorded from here: the deployment's own reclaimer records the settings of record, and
    // this run applies them wherever they are larger than this shell's (reclaim.ts).
    const settings = reclaimSettings(context.config);
    try {
      if (input.options.yes !== true) {
        const plan = await planOrphans({ db, lister: client, provisioner: identity }, settings);
        return {
          result: {
            applied: false,
            due: plan.due.map((sandbox) => sandbox.sandboxId),
            leaked: plan.leaked.map(orphanView),
            brakeLifted: plan.brakeLifted,
            settings: settingsView(plan.settings),
          },
          text: `Dry run: nothing was changed. With --yes, reclaim would delete ${plural(plan.due.length, 'sandbox', 'sandboxes')}.\n${renderOrphans(plan)}`,
        };
      }
      // Before anything is listed or recorded: without the deployment's settings of record, the
      // only grace and bounds are this shell's, and a shell with only DATABASE_URL and
      // SANDBOX_PROVISIONER_URL set has the defaults, not what the stage configured.
      const unrecorded = unrecordedSettings(await settingsOfRecord(db, settings));
      const fromEnvironment = unrecorded.length > 0;
      if (fromEnvironment && input.options['settings-from-environment'] !== true) {
        throw new NoSettingsOfRecordError(
          `this database holds no settings of record for ${unrecorded.join(', ')}: the deployment's reclaimer has not run against it yet, so the only grace and bounds are this shell's (RECLAIM_GRACE_SECONDS=${settings.graceSeconds}, SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS=${settings.provisionerDeleteTimeoutSeconds}), which need not be the stage's. Nothing was listed, recorded or deleted. Let the deployed reclaimer run once, or pass --settings-from-environment to act on this shell's settings`,
        );
      }
      const provider = new SandboxProvider({
        client,
        releaseLockTimeoutMs: context.config.releaseLockTimeoutSeconds * 1000,
        provisionerDeleteTimeoutMs: context.config.provisionerDeleteTimeoutSeconds * 1000,
      });
      // The provider's own per-request bound stays this shell's; the attempt's bound and the
      // quarantine come from the settings of record where they are larger (reclaim.ts).
      const telemetry = context.telemetry();
      const events: ReclaimEvent[] = [];
      const report = await runReclaim(
        {
          db,
          provider,
          lister: client,
          provisioner: identity,
          onEvent: (event) => {
            events.push(event);
            reportReclaimEvent(telemetry, event);
          },
        },
        settings,
      );
      reportReclaimRun(telemetry, report);
      telemetry.count(MetricName.SANDBOXES_LISTED, {}, report.listed);
      const failed = events.filter((event) => event.kind === 'failed' || event.kind === 'unconfirmed').length;
      return {
        result: {
          applied: true,
          listed: report.listed,
          leaked: report.leaked.length,
          reclaimed: report.reclaimed,
          kept: report.skipped,
          failed: report.failed,
          deferred: report.deferred,
          brakeLifted: report.brakeLifted,
          settings: settingsView(report.settings),
          settingsFromEnvironment: fromEnvironment ? unrecorded : [],
          events: events.map((event) => ({
            kind: event.kind,
            sandboxId: event.sandbox.sandboxId,
            reason: event.sandbox.reason,
            ...(event.kind === 'reclaimed' ? { outcome: event.outcome, generation: event.generation } : {}),
            ...(event.kind === 'skipped' ? { verdict: event.verdict } : {}),
          })),
        },
        text: [
          `${report.listed} listed, ${report.leaked.length} leaked: reclaimed ${report.reclaimed}, kept ${report.skipped}, failed ${report.failed}${report.deferred ? `, ${report.deferred} left for the next run` : ''}.`,
          ...(fromEnvironment
            ? [
                `No settings of record for ${unrecorded.join(', ')}: this shell's were used (--settings-from-environment).`,
              ]
            : []),
          renderSettings(report.settings),
          ...events.map(eventLine),
        ].join('\n'),
        ...(failed
          ? {
              exitCode: ExitCode.BUSY,
              warning: `${plural(failed, 'reclaim')} did not complete; they stay leaked and are tried again next run`,
            }
          : {}),
      };
    } catch (error) {
      if (error instanceof ReclaimRefusedError) return refusedOutput(error);
      throw error;
    } finally {
      await client.close();
    }
  },
};
