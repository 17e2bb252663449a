/**
 * The WebSocket bridge in a process of its own, started by `startBridgeProcess`. Neon's proxy is
 * never inside the function's process; in-process here, its frame parsing and piping would run on
 * the benchmark's event loop, between the very statements whose timing is measured.
 *
 * Prints one JSON line `{"address": "127.0.0.1:<port>"}` once listening; exits when stdin closes
 * (its parent is gone) or on SIGTERM.
 */
import { startDatabaseBridge } from '../../infra/local/db-bridge.ts';

const bridge = await startDatabaseBridge();
process.stdout.write(`${JSON.stringify({ address: bridge.address })}\n`);
const stop = () => {
  void bridge.close().finally(() => process.exit(0));
};
process.stdin.on('end', stop);
process.stdin.on('close', stop);
process.stdin.resume();
process.on('SIGTERM', stop);
