import type { BuildOptions } from 'esbuild';

export const DEFAULT_OUTFILE: string;
export const NODE_COMMAND_BUNDLE: BuildOptions;
export function buildOpsBundle(outfile?: string): Promise<void>;
