/**
 * `orphans`: the reclaimer's dry run. Lists the provisioner's live sandboxes, classifies each
 * against the database exactly as a reclaim run would, and shows what would be reclaimed now and
 * why, and what is leaked but still waiting (and for what). Records nothing, deletes nothing.
 */
import { requireProvisionerUrl } from '../../../functions/adapters/config.ts';
import { openProvisionerClient } from '../../../functions/adapters/open-provisioner.ts';
import type { ProvisionerClient } from '../../../functions/adapters/provisioner-client.ts';
import { provisionerTokenSource } from '../../../functions/adapters/provisioner-token.ts';
import {
  type ClassifiedSandbox,
  planOrphans,
  provisionerIdentity,
  type ReclaimPlan,
  type SettingsOfRecord,
} from '../../../functions/cleanup/reclaim.ts';
import { ReclaimRefusal, ReclaimRefusedError } from '../../../functions/cleanup/reclaim-listing.ts';
import { reclaimSettings } from '../../../functions/reclaimer/handler.ts';
import type { Command, CommandOutput } from '../command.ts';
import type { OpsContext } from '../context.ts';
import { ExitCode } from '../exit-codes.ts';
import { orDash, plural, renderTable } from '../format.ts';

export interface OrphanView {
  sandboxId: string;
  listedGeneration: number | null;
  owners: Array<{
    uid: string;
    runtimeScopeId: string;
    generation: number;
    released: boolean;
    hold: string | null;
  }>;
  leaked: boolean;
  reason: string | null;
  /** Null: reclaimed by the next run (within RECLAIM_MAX_PER_RUN). */
  waiting: string | null;
  seenLeakedSince: string | null;
}

export function orphanView(sandbox: ClassifiedSandbox): OrphanView {
  return {
    sandboxId: sandbox.sandboxId,
    listedGeneration: sandbox.generation,
    owners: sandbox.owners,
    leaked: sandbox.leaked,
    reason: sandbox.reason,
    waiting: sandbox.waiting,
    seenLeakedSince: sandbox.firstSeenAt?.toISOString() ?? null,
  };
}

/** What the run applies of the deployment's settings of record, for `--json` and for people. */
export function settingsView(settings: SettingsOfRecord): {
  graceSeconds: number;
  runtimeCleanupTimeoutSeconds: number;
  provisionerDeleteTimeoutSeconds: number;
  maxSharePercent: number;
  maxPerRun: number;
  tightened: string[];
  recorded: SettingsOfRecord['recorded'];
} {
  const { effective } = settings;
  return {
    graceSeconds: effective.graceSeconds,
    runtimeCleanupTimeoutSeconds: effective.runtimeCleanupTimeoutMs / 1000,
    provisionerDeleteTimeoutSeconds: effective.provisionerDeleteTimeoutSeconds,
    maxSharePercent: effective.maxSharePercent,
    maxPerRun: effective.maxPerRun,
    tightened: settings.tightened,
    recorded: settings.recorded,
  };
}

/** One line on the settings a run applies, and where they come from. */
export function renderSettings(settings: SettingsOfRecord): string {
  const by = settings.recorded[0];
  const source = by
    ? `the deployment's settings of record (recorded by ${by.recordedBy} at ${by.recordedAt})${settings.tightened.length ? `, which are stricter than this shell's in ${settings.tightened.join(', ')}` : ''}`
    : "this shell's configuration: no deployment has recorded its settings in this database";
  const { effective } = settings;
  return `Settings: grace ${effective.graceSeconds} s, release bound ${effective.runtimeCleanupTimeoutMs / 1000} s, delete timeout ${effective.provisionerDeleteTimeoutSeconds} s, at most ${effective.maxSharePercent}% of a listing leaked and ${effective.maxPerRun} per run, from ${source}.`;
}

export function renderOrphans(plan: ReclaimPlan & { settings?: SettingsOfRecord }): string {
  const due = new Set(plan.due.map((sandbox) => sandbox.sandboxId));
  const lifted = plan.brakeLifted
    ? `\nBrake ${plan.brakeLifted.brake} lifted: a healthy listing of this provisioner confirmed its pairing with this database at ${plan.brakeLifted.pairedAt}.`
    : '';
  const heading = `${plural(plan.listed, 'live sandbox', 'live sandboxes')} listed, ${plan.leaked.length} leaked, ${plan.due.length} due now${plan.deferred ? ` (${plan.deferred} more over RECLAIM_MAX_PER_RUN)` : ''}${plan.settings ? `\n${renderSettings(plan.settings)}` : ''}${lifted}`;
  if (!plan.leaked.length) return `${heading}.`;
  const table = renderTable(
    ['SANDBOX', 'GEN', 'SCOPE', 'WHY LEAKED', 'SEEN LEAKED SINCE', 'STATE'],
    plan.leaked.map((sandbox) => [
      sandbox.sandboxId,
      orDash(sandbox.generation),
      sandbox.owners.length
        ? sandbox.owners.map((owner) => `${owner.uid}/${owner.runtimeScopeId}`).join(', ')
        : '-',
      orDash(sandbox.reason),
      orDash(sandbox.firstSeenAt?.toISOString()),
      due.has(sandbox.sandboxId) ? 'due' : orDash(sandbox.waiting),
    ]),
  );
  return `${heading}\n${table}`;
}

/** A refused listing or a runaway share, as the CLI reports it: not a bug, and nothing was done. */
export function refusedOutput(error: ReclaimRefusedError): CommandOutput {
  const exitCode = error.reason === ReclaimRefusal.LIST_UNAVAILABLE ? ExitCode.UNREACHABLE : ExitCode.REFUSED;
  return {
    result: { refused: error.reason, message: error.message, details: error.details },
    text: `Refused (${error.reason}): ${error.message}. Nothing was recorded or deleted.`,
    exitCode,
    warning: `reclaim refused (${error.reason}): ${error.message}`,
  };
}

/**
 * The provisioner the functions use; the CLI requires it (it has no built-in one to fall back to),
 * with SANDBOX_PROVISIONER_TOKEN when set (its deployed parameter alone is refused, with the way to
 * export it). `identity` names it in the pairing evidence (reclaim.ts), as the deployed reclaimer
 * does.
 */
export async function opsProvisioner(
  context: OpsContext,
): Promise<{ client: ProvisionerClient; identity: string }> {
  const { config } = context;
  const client = await openProvisionerClient({
    config,
    provisionerToken: () => provisionerTokenSource(config),
  });
  return { client, identity: provisionerIdentity(requireProvisionerUrl(config)) };
}

export const orphansCommand: Command = {
  name: 'orphans',
  arguments: [],
  summary: 'dry run of the reclaimer: leaked sandboxes, why, and which are due now',
  details:
    'Lists GET /api/sandboxes at SANDBOX_PROVISIONER_URL and classifies each sandbox against the database.\n' +
    'Records nothing and deletes nothing. Exit 1 when the listing is refused (hostile or runaway), 3 when unreachable.',
  options: {},
  async run(_input, context) {
    const db = await context.database();
    const { client, identity } = await opsProvisioner(context);
    try {
      const plan = await planOrphans(
        { db, lister: client, provisioner: identity },
        reclaimSettings(context.config),
      );
      return {
        result: {
          listed: plan.listed,
          leaked: plan.leaked.map(orphanView),
          due: plan.due.map((sandbox) => sandbox.sandboxId),
          deferred: plan.deferred,
          brakeLifted: plan.brakeLifted,
          settings: settingsView(plan.settings),
        },
        text: renderOrphans(plan),
      };
    } catch (error) {
      if (error instanceof ReclaimRefusedError) return refusedOutput(error);
      throw error;
    } finally {
      await client.close();
    }
  },
};
