import { describe, expect, it } from 'vitest';
import {
  DatabaseDriver,
  databaseDriverFor,
  defaultDatabaseDriver,
  isNeonHost,
} from '../../functions/adapters/database-driver.ts';
import { tcpConnectionString } from '../../functions/adapters/database-tcp.ts';

describe('the driver by host, when DATABASE_DRIVER is unset', () => {
  it.each([
    'postgresql://alex:pw@ep-cool-darkness-a1b2c3d4.us-east-2.aws.neon.tech/dbname?sslmode=require',
    'postgresql://alex:pw@ep-cool-darkness-a1b2c3d4-pooler.us-east-2.aws.neon.tech/dbname',
    'postgres://u:p@ep-x-123.eastus2.azure.neon.tech/db',
    'postgres://default:pw@ep-small-cake-1569-pooler.us-east-1.postgres.vercel-storage.com:5432/verceldb',
    // A postgres: URL's host keeps its case and a trailing dot as written.
    'postgres://u:p@EP-X.US-EAST-2.AWS.NEON.TECH./db',
  ])('neon for Neon’s host in %s', (url) => {
    expect(defaultDatabaseDriver(url)).toBe(DatabaseDriver.NEON);
  });

  it.each([
    'postgres://postgres@127.0.0.1:5432/postgres',
    'postgres://postgres@localhost/postgres',
    'postgres://app:pw@mydb.abc123xyz.eu-west-1.rds.amazonaws.com:5432/app?sslmode=verify-full',
    'postgres://app:pw@db.internal:6432/app',
    // Look-alikes: not under Neon's domain.
    'postgres://u:p@neon.tech.evil.example/db',
    'postgres://u:p@evilneon.tech/db',
    'postgres://u:p@neon.tech/db',
    'not a url at all',
  ])('tcp for %s', (url) => {
    expect(defaultDatabaseDriver(url)).toBe(DatabaseDriver.TCP);
  });

  it('DATABASE_DRIVER, when set, wins over the host either way', () => {
    expect(databaseDriverFor('postgres://postgres@127.0.0.1/postgres', 'neon')).toBe('neon');
    expect(databaseDriverFor('postgres://u:p@ep-x.us-east-2.aws.neon.tech/db', 'tcp')).toBe('tcp');
    expect(databaseDriverFor('postgres://u:p@ep-x.us-east-2.aws.neon.tech/db', undefined)).toBe('neon');
    expect(isNeonHost(' ep-x.us-east-1.aws.neon.tech ')).toBe(true);
  });
});

describe('the connection string the tcp driver gives pg', () => {
  it.each(['prefer', 'require', 'verify-ca'])(
    'spells sslmode=%s verify-full: pg 8’s meaning, pinned',
    (mode) => {
      expect(
        tcpConnectionString(`postgres://app:p%40ss@db.example/app?sslmode=${mode}&application_name=x`),
      ).toBe('postgres://app:p%40ss@db.example/app?sslmode=verify-full&application_name=x');
      expect(tcpConnectionString(`postgres://db.example/app?connect_timeout=5&sslmode=${mode}`)).toBe(
        'postgres://db.example/app?connect_timeout=5&sslmode=verify-full',
      );
    },
  );

  it.each([
    'postgres://app:pw@db.example/app?sslmode=verify-full&sslrootcert=/var/task/rds.pem',
    'postgres://app:pw@db.example/app?sslmode=disable',
    'postgres://app:pw@db.example/app?sslmode=no-verify',
    'postgres://app:pw@db.example/app',
    // libpq's meaning asked for explicitly.
    'postgres://app:pw@db.example/app?uselibpqcompat=true&sslmode=require',
    // Not an sslmode parameter, only a name ending in it.
    'postgres://app:pw@db.example/app?xsslmode=require',
  ])('leaves %s byte for byte', (url) => {
    expect(tcpConnectionString(url)).toBe(url);
  });
});
