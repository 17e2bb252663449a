/**
 * The SQS emulator (fauxqs) in a process of its own, for `npm run bench -- --sqs-process`. SQS is a
 * remote service in deployment; in the functions' process, the emulator's HTTP server and queue
 * work take event-loop time from the handlers being measured. The default run keeps it in process,
 * as `npm run stack` does.
 *
 * Prints one JSON line `{"endpoint": "http://127.0.0.1:<port>"}` once listening; exits when stdin
 * closes (its parent is gone) or on SIGTERM.
 */
import { startFauxqs } from 'fauxqs';

const server = await startFauxqs({ port: 0, host: '127.0.0.1', logger: false });
process.stdout.write(`${JSON.stringify({ endpoint: `http://127.0.0.1:${server.port}` })}\n`);
const stop = () => {
  void Promise.resolve(server.stop()).finally(() => process.exit(0));
};
process.stdin.on('end', stop);
process.stdin.on('close', stop);
process.stdin.resume();
process.on('SIGTERM', stop);
