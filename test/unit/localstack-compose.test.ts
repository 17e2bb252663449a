/**
 * The LocalStack environment's parts agree with each other: the compose file (which cannot be
 * started here: no Docker), the addresses the deploy script and the smoke check use
 * (infra/localstack/topology.ts), the local stage's params in serverless.yml, its plugin list, and
 * what docs/localstack.md tells a developer runs where.
 */
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import {
  COMPOSE_FILE,
  COMPOSE_NETWORK,
  LOCAL_STAGE,
  LOCALSTACK,
  LOCALSTACK_REGION,
  LOCALSTACK_SERVICES,
  POSTGRES,
  POSTGRES_LAMBDA_URL,
  PROVISIONER,
} from '../../infra/localstack/topology.ts';
import { codeIn, REPO_ROOT, readDoc, tableRows } from '../support/docs.ts';

interface ComposeService {
  image: string;
  ports?: string[];
  environment?: Record<string, string>;
  volumes?: string[];
  command?: string[];
  healthcheck?: { test: string[] };
}
interface Compose {
  name: string;
  services: Record<string, ComposeService>;
  networks: { default: { name: string } };
}

const compose = parse(readFileSync(join(REPO_ROOT, COMPOSE_FILE), 'utf8')) as Compose;
const serverless = parse(readFileSync(join(REPO_ROOT, 'serverless.yml'), 'utf8')) as {
  params: Record<string, Record<string, unknown>>;
};
const manifest = JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as {
  devDependencies: Record<string, string>;
};
const plugins = createRequire(import.meta.url)('../../infra/serverless/plugins.cjs') as {
  pluginsFor: (stage: string) => string[];
  LOCAL_STAGE: string;
  LOCAL_STAGE_PLUGIN: string;
};

const SERVICES = [LOCALSTACK.service, POSTGRES.service, PROVISIONER.service];
const service = (name: string) => compose.services[name]!;
const hostOf = (url: string) => new URL(url).hostname;
const portOf = (url: string) => Number(new URL(url).port);

describe('infra/localstack/compose.yml', () => {
  it('parses, and starts exactly LocalStack, PostgreSQL and the provisioner', () => {
    expect(Object.keys(compose.services).sort()).toEqual([...SERVICES].sort());
  });

  it('pins every image to a version, Node to the one the project pins', () => {
    for (const [name, { image }] of Object.entries(compose.services)) {
      const [, tag = ''] = image.split(':');
      expect(tag, `${name}: ${image}`).toMatch(/^\d+\.\d+(\.\d+)?(-[\w.-]+)?$/);
    }
    expect(service(PROVISIONER.service).image.split(':')[1]!.split('-')[0]).toBe(
      manifest.devDependencies.node,
    );
  });

  it('publishes each service on this machine’s loopback where the scripts look for it', () => {
    expect(service(LOCALSTACK.service).ports).toEqual([
      `127.0.0.1:${portOf(LOCALSTACK.hostEndpoint)}:${LOCALSTACK.port}`,
    ]);
    expect(service(POSTGRES.service).ports).toEqual([`127.0.0.1:${POSTGRES.hostPort}:${POSTGRES.port}`]);
    expect(service(PROVISIONER.service).ports).toEqual([
      `127.0.0.1:${portOf(PROVISIONER.hostUrl)}:${PROVISIONER.port}`,
    ]);
  });

  it('starts every AWS service the local stage uses, its Lambda containers on the compose network', () => {
    const environment = service(LOCALSTACK.service).environment!;
    expect(environment.SERVICES!.split(',')).toEqual([...LOCALSTACK_SERVICES]);
    expect(environment.LAMBDA_DOCKER_NETWORK).toBe(COMPOSE_NETWORK);
    expect(compose.networks.default.name).toBe(COMPOSE_NETWORK);
    expect(environment.LAMBDA_IGNORE_ARCHITECTURE).toBe('1');
    // LocalStack starts those containers through the Docker socket.
    expect(service(LOCALSTACK.service).volumes).toContain('/var/run/docker.sock:/var/run/docker.sock');
  });

  it('creates the database the deploy puts into SSM, with its user and password', () => {
    expect(service(POSTGRES.service).environment).toEqual({
      POSTGRES_USER: POSTGRES.user,
      POSTGRES_PASSWORD: POSTGRES.password,
      POSTGRES_DB: POSTGRES.database,
    });
    const lambdaUrl = new URL(POSTGRES_LAMBDA_URL);
    expect([lambdaUrl.hostname, Number(lambdaUrl.port)]).toEqual([POSTGRES.service, POSTGRES.port]);
  });

  it('runs the project’s own provisioner CLI on the port the functions are given', () => {
    const command = service(PROVISIONER.service).command!;
    const script = command.find((part) => part.endsWith('.ts'))!;
    expect(script).toBe('infra/local/provisioner/cli.ts');
    expect(existsSync(join(REPO_ROOT, script))).toBe(true);
    expect(command[command.indexOf('--port') + 1]).toBe(String(PROVISIONER.port));
    expect(command[command.indexOf('--host') + 1]).toBe('0.0.0.0');
    expect([hostOf(PROVISIONER.lambdaUrl), portOf(PROVISIONER.lambdaUrl)]).toEqual([
      PROVISIONER.service,
      PROVISIONER.port,
    ]);
    expect(service(PROVISIONER.service).volumes).toContain('../..:/app:ro');
  });

  it('gives every service a health check, so `up --wait` returns when they answer', () => {
    for (const name of SERVICES) expect(service(name).healthcheck?.test.length, name).toBeGreaterThan(1);
  });
});

describe('the local stage', () => {
  it('reaches LocalStack under its compose service name, with the TCP driver, in the region the scripts use', () => {
    const local = serverless.params[LOCAL_STAGE]!;
    expect(local.awsEndpointUrl).toBe(LOCALSTACK.lambdaEndpoint);
    expect([hostOf(LOCALSTACK.lambdaEndpoint), portOf(LOCALSTACK.lambdaEndpoint)]).toEqual([
      LOCALSTACK.service,
      LOCALSTACK.port,
    ]);
    expect(local.DATABASE_DRIVER).toBe('tcp');
    expect(local.region ?? serverless.params.default!.region).toBe(LOCALSTACK_REGION);
  });

  it('loads the LocalStack plugin for that stage alone', () => {
    expect(plugins.LOCAL_STAGE).toBe(LOCAL_STAGE);
    expect(plugins.pluginsFor(LOCAL_STAGE)).toEqual(['serverless-esbuild', plugins.LOCAL_STAGE_PLUGIN]);
    expect(existsSync(join(REPO_ROOT, plugins.LOCAL_STAGE_PLUGIN))).toBe(true);
    for (const stage of ['dev', 'prod', 'ci', 'localstack']) {
      expect(plugins.pluginsFor(stage), stage).toEqual(['serverless-esbuild']);
    }
  });
});

describe('docs/localstack.md', () => {
  it('names every service the compose file starts, with its image, and no other', async () => {
    const rows = tableRows(await readDoc('docs/localstack.md')).filter((row) => row.length === 5);
    const documented = Object.fromEntries(rows.map((row) => [codeIn(row[0]!)!, codeIn(row[1]!)!]));
    expect(documented).toEqual(
      Object.fromEntries(Object.entries(compose.services).map(([name, { image }]) => [name, image])),
    );
  });
});
