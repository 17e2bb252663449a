/**
 * The demo platform's structured log: one JSON line per event on stdout, shaped like the
 * functions' lines (level, message, timestamp, service, function), so the demo reads what the
 * platform did from the same stream, and the log file tells the whole story in one place.
 */
import { PLATFORM_SOURCE, type PlatformMessage } from './lines.ts';

export type PlatformLog = (
  message: (typeof PlatformMessage)[keyof typeof PlatformMessage],
  fields?: Record<string, unknown>,
  level?: 'INFO' | 'WARN' | 'ERROR',
) => void;

export const platformLog: PlatformLog = (message, fields = {}, level = 'INFO') => {
  process.stdout.write(
    `${JSON.stringify({
      level,
      message,
      timestamp: new Date().toISOString(),
      service: 'agent-platform',
      function: PLATFORM_SOURCE,
      ...fields,
    })}\n`,
  );
};
