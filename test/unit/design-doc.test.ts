/**
 * docs/design.md describes mechanisms by the names they have in the code; these checks tie each
 * such claim to the place that implements it, so that the text goes stale loudly, not silently.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { REPO_ROOT, readDoc } from '../support/docs.ts';

const migration = (name: string) => readFileSync(join(REPO_ROOT, 'infra/migrations', name), 'utf8');
/** A SQL function's one file (infra/sql/README.md). */
const sqlFunction = (name: string) => readFileSync(join(REPO_ROOT, 'infra/sql', `${name}.sql`), 'utf8');
const flat = (text: string) => text.replace(/\s+/g, ' ');

describe('docs/design.md', () => {
  it('describes the pre-delete check as the release guard, one statement under the scope lock that records the delete in flight', async () => {
    const design = flat(await readDoc('docs/design.md'));
    // The old description (a plain read with no lock) is what the guard replaced.
    expect(design).not.toContain('reads once more, with no transaction and no lock');
    expect(design).toContain(
      'runs the release guard: one statement (in a one-message READ COMMITTED transaction, like the phases',
    );
    // Sent through Database.transact, never at the session's default isolation (release-guard.ts).
    expect(design).not.toContain('autocommit statement that');
    expect(design).toContain('records the delete in flight');
    expect(design).toContain('`infra/sql/runtime_cleanup_begin_release.sql`');
    const guard = sqlFunction('runtime_cleanup_begin_release');
    expect(guard).toMatch(/FUNCTION runtime_cleanup_begin_release/);
    expect(guard).toMatch(/delete_in_flight_until\s*=/);
    expect(guard).toMatch(/pg_advisory_xact_lock/);
  });

  it('says force-clear refuses while a delete is in flight, with the code the command uses', async () => {
    const design = flat(await readDoc('docs/design.md'));
    expect(design).toContain('refuses while a delete may still be in flight');
    expect(design).toContain('`DELETE_IN_FLIGHT`');
    expect(readFileSync(join(REPO_ROOT, 'functions/cleanup/force-clear.ts'), 'utf8')).toContain(
      'DELETE_IN_FLIGHT',
    );
  });

  it('says released_at is reset by the trigger of migration 005', async () => {
    const design = flat(await readDoc('docs/design.md'));
    expect(design).toContain('a trigger (migration 005) resets it');
    expect(migration('005_generation_released_at.sql')).toMatch(
      /CREATE TRIGGER sandbox_runtimes_reset_released[\s\S]*EXECUTE FUNCTION sandbox_runtimes_reset_released\(\)/,
    );
    expect(sqlFunction('sandbox_runtimes_reset_released')).toMatch(/NEW\.released_at := NULL/);
  });

  it('states invariant 5 as the chaos suite checks it, and the force-clear exception to invariant 1', async () => {
    const design = flat(await readDoc('docs/design.md'));
    const invariant5 = design.slice(
      design.indexOf('5. **Nothing is lost**'),
      design.indexOf('## Failure table'),
    );
    // "no sandbox left behind" is invariant 1b in the suite, and a forced clear is its exception.
    expect(invariant5).not.toContain('no sandbox is left behind');
    expect(invariant5).toContain('dead-lettered by the function with its reason and error code');
    expect(design).toContain('(1b) no sandbox is left behind by a fence that a cleanup cleared');
    expect(design).toContain('`ops force-clear` is the one exception');
  });
});
