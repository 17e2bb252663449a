import { describe, expect, it } from 'vitest';
import { isLoopbackHost, loopbackAddress } from '../../functions/adapters/loopback.ts';

describe('loopbackAddress', () => {
  it.each([
    ['localhost', '127.0.0.1'],
    ['LOCALHOST', '127.0.0.1'],
    ['LocalHost.', '127.0.0.1'],
    ['127.0.0.1', '127.0.0.1'],
    ['127.1', '127.0.0.1'],
    ['127.0.1', '127.0.0.1'],
    ['127.255.3.4', '127.255.3.4'],
    ['0x7f.1', '127.0.0.1'],
    ['2130706433', '127.0.0.1'],
    ['::1', '::1'],
    ['[::1]', '::1'],
    ['0:0:0:0:0:0:0:1', '::1'],
    ['[0000::1]', '::1'],
    ['::ffff:127.0.0.1', '127.0.0.1'],
    ['[::ffff:7f01:203]', '127.1.2.3'],
  ])('%s is loopback (%s)', (host, address) => {
    expect(loopbackAddress(host)).toBe(address);
    expect(isLoopbackHost(host)).toBe(true);
  });

  it.each([
    '',
    '128.0.0.1',
    '126.255.255.255',
    '10.0.0.1',
    'db.internal',
    'localhost.example.com',
    'mylocalhost',
    '127.0.0.1.nip.io',
    '::2',
    '[::]',
    '0.0.0.0',
    '::ffff:10.0.0.1',
    'ep-cool-name-123.eu-central-1.aws.neon.tech',
  ])('%s is not', (host) => {
    expect(loopbackAddress(host)).toBeUndefined();
    expect(isLoopbackHost(host)).toBe(false);
  });
});
