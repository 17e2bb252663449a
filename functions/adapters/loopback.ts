/**
 * This machine's loopback, recognised however a host is spelled. Used to decide which database
 * connections go through the local WebSocket bridge, and by the bridge to refuse every other target.
 */

/**
 * Whether a host (as a URL or the Neon driver spells it) is this machine's loopback: `localhost`
 * in any case and with a trailing dot, 127.0.0.0/8 in any IPv4 spelling (`127.1`, `0x7f.1`,
 * `2130706433`), and `::1` with or without brackets, expanded or IPv4-mapped. A postgres:// URL's
 * host is opaque to the URL parser (`LOCALHOST` and `127.1` stay as written), so it is
 * normalised here the way an http:// host is.
 */
export function loopbackAddress(host: string): string | undefined {
  const bare = host
    .trim()
    .replace(/^\[|\]$/g, '')
    .replace(/\.$/, '');
  if (bare === '') return undefined;
  let normalised: string;
  try {
    normalised = new URL(`http://${bare.includes(':') ? `[${bare}]` : bare}/`).hostname;
  } catch {
    return undefined;
  }
  if (normalised === 'localhost') return '127.0.0.1';
  if (/^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(normalised)) return normalised;
  if (normalised === '[::1]') return '::1';
  const mapped = /^\[::ffff:7f([0-9a-f]{2}):([0-9a-f]{1,4})\]$/.exec(normalised);
  if (mapped) {
    const low = Number.parseInt(mapped[2]!, 16);
    return `127.${Number.parseInt(mapped[1]!, 16)}.${low >> 8}.${low & 0xff}`;
  }
  return undefined;
}

export function isLoopbackHost(host: string): boolean {
  return loopbackAddress(host) !== undefined;
}
