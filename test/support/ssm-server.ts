import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * A real HTTP server that speaks the part of AWS Systems Manager's data plane the functions use:
 * `GetParameter` over the awsJson1_1 protocol (`POST /`, `X-Amz-Target: AmazonSSM.GetParameter`,
 * a JSON body, SigV4-signed for the `ssm` service). The functions' real SDK client talks to it
 * through the SDK's own endpoint override (`AWS_ENDPOINT_URL_SSM`), so what is tested is the
 * request the SDK really sends and the answer it really parses. SSM itself cannot run here.
 */
export interface StoredParameter {
  type: 'String' | 'SecureString' | 'StringList';
  value: string;
}

export interface SsmRequest {
  name: string;
  withDecryption: boolean;
  /** The SigV4 credential scope's service: `ssm` when the SDK signed for SSM. */
  signedFor: string | undefined;
}

export interface LocalSsm {
  readonly endpoint: string;
  /** Every GetParameter that reached the server, in order. */
  readonly requests: SsmRequest[];
  put(name: string, parameter: StoredParameter): void;
  /** The next GetParameter calls for `name` fail with this AWS error type until cleared. */
  failWith(name: string, error: { type: string; message: string; status?: number } | undefined): void;
  close(): Promise<void>;
}

/**
 * What a deployed function's SDK client reads from its environment besides the endpoint override
 * (AWS_ENDPOINT_URL_SSM): a region and credentials, which this server does not check.
 */
export const SDK_ENV = {
  AWS_REGION: 'us-east-1',
  AWS_ACCESS_KEY_ID: 'test-access-key',
  AWS_SECRET_ACCESS_KEY: 'test-secret-key',
} as const;

const TARGET = 'AmazonSSM.GetParameter';

function reply(response: ServerResponse, status: number, body: unknown): void {
  response.writeHead(status, { 'content-type': 'application/x-amz-json-1.1' }).end(JSON.stringify(body));
}

async function readBody(request: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of request) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

export async function startLocalSsm(options: { region?: string; account?: string } = {}): Promise<LocalSsm> {
  const region = options.region ?? 'us-east-1';
  const account = options.account ?? '000000000000';
  const parameters = new Map<string, StoredParameter & { version: number }>();
  const failures = new Map<string, { type: string; message: string; status?: number }>();
  const requests: SsmRequest[] = [];

  const server = createServer((request, response) => {
    void (async () => {
      const body = await readBody(request);
      if (request.method !== 'POST' || request.headers['x-amz-target'] !== TARGET) {
        reply(response, 400, {
          __type: 'UnknownOperationException',
          message: `only ${TARGET} is served here, got ${request.method} ${String(request.headers['x-amz-target'])}`,
        });
        return;
      }
      const signedFor = /Credential=[^/]+\/\d{8}\/[^/]+\/([^/]+)\/aws4_request/.exec(
        String(request.headers.authorization ?? ''),
      )?.[1];
      let input: { Name?: unknown; WithDecryption?: unknown };
      try {
        input = JSON.parse(body) as typeof input;
      } catch {
        reply(response, 400, { __type: 'SerializationException', message: 'body is not JSON' });
        return;
      }
      const name = String(input.Name ?? '');
      requests.push({ name, withDecryption: input.WithDecryption === true, signedFor });
      const failure = failures.get(name);
      if (failure) {
        reply(response, failure.status ?? 400, { __type: failure.type, message: failure.message });
        return;
      }
      const parameter = parameters.get(name);
      if (!parameter) {
        reply(response, 400, { __type: 'ParameterNotFound', message: '' });
        return;
      }
      // Without decryption SSM returns a SecureString's ciphertext, never the value.
      const value =
        parameter.type === 'SecureString' && input.WithDecryption !== true
          ? Buffer.from(`ciphertext:${parameter.version}`).toString('base64')
          : parameter.value;
      reply(response, 200, {
        Parameter: {
          Name: name,
          Type: parameter.type,
          Value: value,
          Version: parameter.version,
          DataType: 'text',
          LastModifiedDate: Date.now() / 1000,
          ARN: `arn:aws:ssm:${region}:${account}:parameter${name.startsWith('/') ? '' : '/'}${name}`,
        },
      });
    })().catch((error: Error) => {
      response.destroy(error);
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const { port } = server.address() as AddressInfo;

  return {
    endpoint: `http://127.0.0.1:${port}`,
    requests,
    put(name, parameter) {
      const version = (parameters.get(name)?.version ?? 0) + 1;
      parameters.set(name, { ...parameter, version });
    },
    failWith(name, error) {
      if (error) failures.set(name, error);
      else failures.delete(name);
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
