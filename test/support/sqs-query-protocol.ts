/**
 * SQS answers two wire protocols: the older AWS query protocol (form-encoded requests, XML
 * answers) and JSON. Debian's boto3 (botocore 1.29) speaks only the query protocol; the local
 * stack's emulator (fauxqs) only JSON. This loopback server lets the Python examples' boto3 reach
 * the real emulator: it re-sends each request, as JSON, to the emulator and writes the emulator's
 * answer back as XML. Only the actions the examples call are translated; any other is refused
 * loudly, so an example that starts calling something else fails instead of passing untested.
 */
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';

/** The request parameters each translated action forwards, and the answer fields it returns. */
const ACTIONS: Record<string, { request: string[]; result: string[] }> = {
  GetQueueUrl: { request: ['QueueName', 'QueueOwnerAWSAccountId'], result: ['QueueUrl'] },
  SendMessage: {
    request: ['QueueUrl', 'MessageBody', 'DelaySeconds'],
    result: ['MessageId', 'MD5OfMessageBody'],
  },
};
const NAMESPACE = 'http://queue.amazonaws.com/doc/2012-11-05/';

export interface SqsQueryProtocolAdapter {
  /** `http://127.0.0.1:<port>`: what the examples' AWS_ENDPOINT_URL_SQS names. */
  readonly url: string;
  close(): Promise<void>;
}

function escapeXml(text: string): string {
  return text.replace(/[<>&'"]/g, (c) => `&#${c.charCodeAt(0)};`);
}

function element(name: string, value: string): string {
  return `<${name}>${escapeXml(value)}</${name}>`;
}

async function bodyOf(request: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of request) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

function errorXml(code: string, message: string): string {
  return `<ErrorResponse xmlns="${NAMESPACE}"><Error><Type>Sender</Type>${element('Code', code)}${element('Message', message)}</Error>${element('RequestId', randomUUID())}</ErrorResponse>`;
}

/** Translates one form-encoded request; returns the status and the XML to answer. */
async function translate(emulator: string, form: URLSearchParams): Promise<[number, string]> {
  const action = form.get('Action') ?? '';
  const shape = ACTIONS[action];
  if (!shape) return [400, errorXml('InvalidAction', `not translated for the examples: ${action}`)];
  const request: Record<string, unknown> = {};
  for (const name of shape.request) {
    const value = form.get(name);
    if (value !== null) request[name] = name === 'DelaySeconds' ? Number(value) : value;
  }
  const response = await fetch(emulator, {
    method: 'POST',
    headers: { 'content-type': 'application/x-amz-json-1.0', 'x-amz-target': `AmazonSQS.${action}` },
    body: JSON.stringify(request),
  });
  const answer = (await response.json()) as Record<string, string>;
  if (!response.ok) {
    // The emulator names the query protocol's error code in this header ("Code;Sender").
    const code = response.headers.get('x-amzn-query-error')?.split(';')[0] ?? answer.__type ?? 'Error';
    return [response.status, errorXml(code, answer.message ?? answer.Message ?? '')];
  }
  const result = shape.result
    .filter((name) => answer[name] !== undefined)
    .map((name) => element(name, String(answer[name])))
    .join('');
  return [
    200,
    `<${action}Response xmlns="${NAMESPACE}"><${action}Result>${result}</${action}Result><ResponseMetadata>${element('RequestId', randomUUID())}</ResponseMetadata></${action}Response>`,
  ];
}

/** Starts the adapter in front of the emulator at `emulator` (its JSON endpoint). */
export async function startSqsQueryProtocolAdapter(emulator: string): Promise<SqsQueryProtocolAdapter> {
  const server = createServer((request, response) => {
    bodyOf(request)
      .then((body) => translate(emulator, new URLSearchParams(body)))
      .then(([status, xml]) => {
        response.writeHead(status, { 'content-type': 'text/xml' }).end(xml);
      })
      .catch((error: Error) => {
        response.writeHead(500, { 'content-type': 'text/xml' }).end(errorXml('InternalError', error.message));
      });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
