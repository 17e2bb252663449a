/**
 * `npm run deploy:local` and `npm run remove:local` without LocalStack, which cannot run here (no
 * Docker): every way they must stop with a clear line before they touch anything, and, against a
 * stand-in for LocalStack's control plane (an HTTP server that answers its health endpoint and
 * SSM's PutParameter, and records every request), that a deploy puts the provisioner's URL into
 * SSM, migrates the database, and sends osls's own AWS calls there with LocalStack's test
 * credentials, not to AWS.
 */
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../../infra/local/embedded-postgres.ts';
import { LOCALSTACK_SERVICES, PROVISIONER } from '../../infra/localstack/topology.ts';
import type { ChildRun } from '../support/child-process.ts';
import { runCommand } from '../support/commands.ts';
import { withFileLock } from '../support/file-lock.ts';
import { useDatabaseFixture, useSqsFixture } from '../support/fixtures.ts';
import { PACKAGE_LOCK_DIR } from '../support/packaged-template.ts';

const CHILD_TIMEOUT_MS = 120_000;

const database = useDatabaseFixture();
const fauxqs = useSqsFixture();

interface Recorded {
  method: string;
  path: string;
  target: string | undefined;
  authorization: string;
  body: string;
}

/** LocalStack's health endpoint and SSM's PutParameter, answered; anything else refused. */
async function startFakeLocalStack(services: Record<string, string>): Promise<{
  endpoint: string;
  requests: Recorded[];
  close(): Promise<void>;
}> {
  const requests: Recorded[] = [];
  const server: Server = createServer((request: IncomingMessage, response) => {
    let body = '';
    request.on('data', (chunk) => {
      body += chunk;
    });
    request.on('end', () => {
      const target = request.headers['x-amz-target'] as string | undefined;
      requests.push({
        method: request.method ?? '',
        path: request.url ?? '',
        target,
        authorization: String(request.headers.authorization ?? ''),
        body,
      });
      response.setHeader('content-type', 'application/json');
      if (request.url === '/_localstack/health') {
        response.end(JSON.stringify({ version: '4.4.0', edition: 'community', services }));
      } else if (target === 'AmazonSSM.PutParameter') {
        response.end(JSON.stringify({ Version: 1, Tier: 'Standard' }));
      } else {
        response.statusCode = 400;
        response.setHeader('content-type', 'text/xml');
        response.end(
          '<ErrorResponse><Error><Type>Sender</Type><Code>ValidationError</Code><Message>refused by the test stand-in</Message></Error></ErrorResponse>',
        );
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    endpoint: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

/**
 * `npm run deploy:local` or `npm run remove:local` minus npm and tsx (their wiring: package-scripts.test.ts),
 * in a process group of its own: osls is its child.
 */
function npmRun(script: 'deploy:local' | 'remove:local', env: Record<string, string>): Promise<ChildRun> {
  return runCommand('localstack', [script === 'deploy:local' ? 'deploy' : 'remove'], {
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...env },
    timeoutMs: CHILD_TIMEOUT_MS,
    processGroup: true,
  });
}

const allServing = Object.fromEntries(LOCALSTACK_SERVICES.map((name) => [name, 'available']));

describe('npm run deploy:local and remove:local', () => {
  let closedEndpoint: string;
  beforeAll(async () => {
    closedEndpoint = `http://127.0.0.1:${await freePort()}`;
  });

  it.each(['deploy:local', 'remove:local'] as const)(
    '%s stops with one line when nothing answers where LocalStack should be',
    async (script) => {
      const run = await npmRun(script, { AWS_ENDPOINT_URL: closedEndpoint });
      expect(run.code).toBe(1);
      expect(run.stderr.trim()).toBe(
        `${script} failed: LocalStack is not reachable at ${closedEndpoint} (ECONNREFUSED): start it with \`docker compose -f infra/localstack/compose.yml up -d\` (needs Docker; docs/localstack.md), or set AWS_ENDPOINT_URL to where it listens`,
      );
    },
  );

  it('tells `npm run stack` (which serves SQS on the same port) from LocalStack', async () => {
    const run = await npmRun('deploy:local', { AWS_ENDPOINT_URL: fauxqs.endpoint });
    expect(run.code).toBe(1);
    expect(run.stderr).toContain(
      `${fauxqs.endpoint} answers, but not as LocalStack (GET /_localstack/health: HTTP`,
    );
    expect(run.stderr).toContain('is `npm run stack`');
  });

  it('names the services a LocalStack started without them lacks, before it writes anything', async () => {
    const fake = await startFakeLocalStack({ ...allServing, lambda: 'disabled', sqs: 'error' });
    try {
      const run = await npmRun('deploy:local', { AWS_ENDPOINT_URL: fake.endpoint });
      expect(run.code).toBe(1);
      expect(run.stderr).toContain(
        `LocalStack at ${fake.endpoint} does not serve lambda (disabled), sqs (error): the local stage needs them`,
      );
      expect(fake.requests.map((request) => request.path)).toEqual(['/_localstack/health']);
    } finally {
      await fake.close();
    }
  });

  describe('against a stand-in for LocalStack', () => {
    let fake: Awaited<ReturnType<typeof startFakeLocalStack>>;
    let run: ChildRun;
    beforeAll(async () => {
      fake = await startFakeLocalStack(allServing);
      // osls works in the project's .serverless/ and .esbuild/ like the template tests' packaging.
      run = await withFileLock(
        PACKAGE_LOCK_DIR,
        () => npmRun('deploy:local', { AWS_ENDPOINT_URL: fake.endpoint, DATABASE_URL: database.t.url }),
        { waitMs: 100_000 },
      );
    }, 240_000);
    afterAll(async () => {
      await fake?.close();
    });

    it('puts the provisioner URL the Lambda containers reach into SSM first', () => {
      const puts = fake.requests.filter((request) => request.target === 'AmazonSSM.PutParameter');
      expect(puts.length, run.stdout + run.stderr).toBeGreaterThanOrEqual(1);
      expect(JSON.parse(puts[0]!.body)).toEqual({
        Name: '/runtime-cleanup/local/sandbox-provisioner-url',
        Type: 'String',
        Value: PROVISIONER.lambdaUrl,
        Overwrite: true,
      });
    });

    it('applies the migrations to the database, then deploys the local stage through osls into it, with test credentials', async () => {
      expect(run.stdout).toContain('applying the migrations to');
      expect(run.stdout).toMatch(/"message":"(schema up to date|migrations applied)"/);
      const aws = fake.requests.filter(
        (request) => request.path !== '/_localstack/health' && !request.target,
      );
      const actions = aws.map((request) => new URLSearchParams(request.body).get('Action'));
      expect(actions).toContain('DescribeStacks');
      const describe = aws.find((request) => request.body.includes('Action=DescribeStacks'))!;
      expect(new URLSearchParams(describe.body).get('StackName')).toBe('runtime-cleanup-local');
      for (const request of aws) expect(request.authorization).toMatch(/^AWS4-HMAC-SHA256 Credential=test\//);
      // The stand-in refuses the stack: the deploy stops there, says so, and puts no database URL.
      expect(run.code).toBe(1);
      expect(run.stderr).toContain('deploy:local failed: osls deploy failed (exit 1); its reason is above');
      const databaseUrlPuts = fake.requests.filter((request) => request.body.includes('/database-url'));
      expect(databaseUrlPuts).toEqual([]);
    });
  });
});
