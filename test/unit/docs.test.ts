import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { RESULTS_BEGIN, RESULTS_END } from '../../bench/report/markdown.ts';
import { CONFIG_DEFAULTS, loadConfig } from '../../functions/adapters/config.ts';
import { deadLetterQueueName } from '../../functions/adapters/queues.ts';
import { codeIn, REPO_ROOT, readDoc, section, tableRows } from '../support/docs.ts';

/**
 * The repository's documentation is kept true by the code it describes: the queues of
 * docs/integration.md against infra/queues.json, its configuration table against the
 * configuration module (both ways), every link inside the repository (down to the heading), every
 * `npm run` a reader is told to type, no reference to anything outside the repository, and a
 * README that stays a short front door to docs/.
 * (test/integration/docs-schema.test.ts checks the schema section against the migrated database.)
 */
const INTEGRATION = 'docs/integration.md';

const queuesJson = JSON.parse(readFileSync(join(REPO_ROOT, 'infra/queues.json'), 'utf8')) as {
  queues: Record<string, { fifo: boolean; consumer: string | null }>;
};

describe('docs/integration.md, section 2: the queues', () => {
  it('lists exactly the queues of infra/queues.json, each with its kind and dead-letter queue', async () => {
    const rows = tableRows(section(await readDoc(INTEGRATION), 2)).filter((row) => row.length >= 4);
    const documented = new Map(rows.map((row) => [codeIn(row[0]!)!, { kind: row[1]!, dlq: row[2]! }]));
    expect([...documented.keys()].sort()).toEqual(Object.keys(queuesJson.queues).sort());
    for (const [name, definition] of Object.entries(queuesJson.queues)) {
      const row = documented.get(name)!;
      expect(row.kind.startsWith(definition.fifo ? 'FIFO' : 'standard'), `${name}: ${row.kind}`).toBe(true);
      expect(codeIn(row.dlq) ?? null, `${name}'s dead-letter queue`).toBe(
        definition.consumer ? deadLetterQueueName(name) : null,
      );
    }
  });
});

describe('docs/integration.md, section 4: the configuration', () => {
  /** Every variable loadConfig reads, found by handing it an environment that records each read. */
  function variablesTheConfigModuleReads(): string[] {
    const read = new Set<string>();
    const env = new Proxy({} as Record<string, string | undefined>, {
      get(_target, key) {
        if (typeof key === 'string') read.add(key);
        return undefined;
      },
    });
    loadConfig(env);
    return [...read].sort();
  }

  it('lists exactly the variables the configuration module reads, no more and no fewer', async () => {
    const rows = tableRows(section(await readDoc(INTEGRATION), 4));
    const documented = rows.map((row) => codeIn(row[0]!)).filter((name): name is string => !!name);
    expect(documented.sort()).toEqual(variablesTheConfigModuleReads());
  });

  it('gives each numeric variable the default the configuration module applies', async () => {
    const rows = tableRows(section(await readDoc(INTEGRATION), 4));
    for (const [name, value] of Object.entries(CONFIG_DEFAULTS)) {
      const row = rows.find((cells) => codeIn(cells[0]!) === name);
      expect(row?.[1], name).toBe(String(value));
    }
  });
});

/** Tracked files and files git would add (new, not ignored): what a clone of this branch holds. */
function repositoryFiles(): string[] {
  return execFileSync('git', ['ls-files', '--cached', '--others', '--exclude-standard', '-z'], {
    cwd: REPO_ROOT,
    encoding: 'utf8',
  })
    .split('\0')
    .filter((file) => file !== '' && existsSync(join(REPO_ROOT, file)));
}

/**
 * The anchors GitHub gives a page's headings: lower case, punctuation dropped, each space a hyphen,
 * a repeated heading numbered (-1, -2 …). Lines inside fenced code blocks are not headings.
 */
function headingAnchors(markdown: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  let fenced = false;
  for (const line of markdown.split('\n')) {
    if (/^\s*```/.test(line)) fenced = !fenced;
    const heading = fenced ? null : /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!heading) continue;
    const slug = heading[1]!
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/ /g, '-');
    const count = seen.get(slug) ?? 0;
    seen.set(slug, count + 1);
    anchors.add(count === 0 ? slug : `${slug}-${count}`);
  }
  return anchors;
}

describe('README.md is the front door', () => {
  const readme = () => readFileSync(join(REPO_ROOT, 'README.md'), 'utf8');

  it('stays short: at most 220 lines, the rest lives in docs/', () => {
    expect(readme().split('\n').length).toBeLessThanOrEqual(220);
  });

  it('says how to integrate second, right after what it is and the three commands', () => {
    const sections = [...readme().matchAll(/^## (.+)$/gm)].map((match) => match[1]);
    expect(sections[0]).toBe('Integrating a platform');
    for (const command of ['npm ci', 'npm start', 'npm test'])
      expect(readme().split('\n## ')[0]).toMatch(new RegExp(`^${command} `, 'm'));
  });

  it('links every page of docs/', () => {
    const linked = new Set([...readme().matchAll(/\]\((docs\/[^)#\s]+)/g)].map((match) => match[1]));
    const pages = repositoryFiles().filter((file) => /^docs\/[^/]+\.md$/.test(file));
    expect(pages.length).toBeGreaterThan(5);
    expect(pages.filter((page) => !linked.has(page))).toEqual([]);
  });

  it('holds no generated benchmark results: they are written into docs/benchmarks.md, between its markers', () => {
    expect(readme()).not.toContain(RESULTS_BEGIN);
    const page = readFileSync(join(REPO_ROOT, 'docs/benchmarks.md'), 'utf8');
    // replaceResultsSection needs each marker once, in order, or a published run throws.
    expect(page.split(RESULTS_BEGIN)).toHaveLength(2);
    expect(page.split(RESULTS_END)).toHaveLength(2);
    expect(page.indexOf(RESULTS_BEGIN)).toBeLessThan(page.indexOf(RESULTS_END));
  });
});

describe('the repository stands alone', () => {
  // Spelled in pieces so this file does not match itself.
  const outside = [['..', 'shared'].join('/'), ['', 'work', ''].join('/')];

  it('no file refers to the shared folder beside the clone, or to an absolute /work path', () => {
    const offenders: string[] = [];
    for (const file of repositoryFiles()) {
      const text = readFileSync(join(REPO_ROOT, file));
      if (text.includes(0)) continue;
      const content = text.toString('utf8');
      content.split('\n').forEach((line, index) => {
        if (outside.some((reference) => line.includes(reference)))
          offenders.push(`${file}:${index + 1}: ${line.trim()}`);
      });
    }
    expect(offenders).toEqual([]);
  });

  it('every relative link in the Markdown files points at a file inside the repository, and at a heading of it', () => {
    const broken: string[] = [];
    for (const file of repositoryFiles().filter((name) => name.endsWith('.md'))) {
      const content = readFileSync(join(REPO_ROOT, file), 'utf8');
      for (const match of content.matchAll(/\]\(([^)\s]+)\)/g)) {
        const [target = '', anchor] = match[1]!.split('#');
        if (/^[a-z]+:/i.test(target)) continue;
        const path = target === '' ? join(REPO_ROOT, file) : resolve(dirname(join(REPO_ROOT, file)), target);
        const inside = !relative(REPO_ROOT, path).startsWith('..');
        if (!inside || !existsSync(path)) {
          broken.push(`${file}: ${match[1]}`);
          continue;
        }
        // A link to a section that was renamed or moved lands at the top of the page, silently.
        if (
          anchor !== undefined &&
          path.endsWith('.md') &&
          !headingAnchors(readFileSync(path, 'utf8')).has(anchor)
        )
          broken.push(`${file}: ${match[1]} (no such heading)`);
      }
    }
    expect(broken).toEqual([]);
  });

  it('every `npm run` the README and docs/ tell a reader to type is a script of package.json', () => {
    const scripts = Object.keys(
      (JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as { scripts: object }).scripts,
    );
    const named = new Set<string>();
    for (const file of repositoryFiles().filter((name) => name === 'README.md' || name.startsWith('docs/'))) {
      const content = readFileSync(join(REPO_ROOT, file), 'utf8');
      // `npm run test:<tier>` is a pattern, not a name: placeholders in angle brackets are skipped.
      for (const match of content.matchAll(/npm run ([a-z][\w:-]*)(?!<)/g)) {
        if (!match[1]!.endsWith(':')) named.add(match[1]!);
      }
      for (const match of content.matchAll(/`(test:[a-z]+)`/g)) named.add(match[1]!);
    }
    expect(named.size).toBeGreaterThan(5);
    expect([...named].filter((name) => !scripts.includes(name))).toEqual([]);
  });
});
