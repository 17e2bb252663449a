import type { Command } from '../command.ts';
import { checkConfigCommand } from './check-config.ts';
import { dlqCommand } from './dlq.ts';
import { explainCommand } from './explain.ts';
import { fencesCommand } from './fences.ts';
import { forceClearCommand } from './force-clear.ts';
import { orphansCommand } from './orphans.ts';
import { reclaimCommand } from './reclaim.ts';
import { redriveCommand } from './redrive.ts';
import { retryCommand } from './retry.ts';

/** Every command of `npm run ops`, in the order `ops help` lists them. */
export const COMMANDS: readonly Command[] = [
  fencesCommand,
  explainCommand,
  dlqCommand,
  redriveCommand,
  retryCommand,
  forceClearCommand,
  orphansCommand,
  reclaimCommand,
  checkConfigCommand,
];
