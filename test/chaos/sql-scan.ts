/**
 * A static check that every SQL statement under functions/ is parameterised: no SQL text built
 * with a template literal substitution (`${…}`) or by concatenating strings, except the one
 * reviewed statements of database.ts: its `BEGIN …; SET LOCAL lock_timeout = ${…}`, built once
 * from validated integers, and the one-round-trip transaction, whose values are inlined as
 * escaped literals (functions/adapters/sql-literal.ts). A small tokenizer finds the literals (comments and quotes understood), and a
 * literal counts as SQL when it reads like a statement.
 */
import { readdir, readFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

export interface SqlFinding {
  file: string;
  line: number;
  text: string;
}

/** Reviewed: integers parsed by the configuration, never message text (see database.ts). */
export const REVIEWED_EXCEPTIONS = [
  {
    file: 'functions/adapters/database.ts',
    startsWith:
      "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL TimeZone = 'UTC'; SET LOCAL DateStyle = 'ISO, MDY'; SET LOCAL lock_timeout = ${",
  },
  // The one-round-trip transaction: the statement's values are inlined by sql-literal.ts (escaped
  // as node-postgres escapes them, every `$` checked); the simple-query protocol takes no parameters.
  // `bounds` is one of two constant texts ('' or the bookkeeping writes' `SET LOCAL lock_timeout = 0`).
  // biome-ignore lint/suspicious/noTemplateCurlyInString: the template's source text, matched as written
  { file: 'functions/adapters/database.ts', startsWith: '${begin}${bounds}; ${statement}; COMMIT' },
] as const;

const SQL_STATEMENT =
  /\b(SELECT\s+[\s\S]*\bFROM\b|SELECT\s+\w+\s*\(|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|WITH\s+\w+\s+AS|BEGIN\b|COMMIT\b|ROLLBACK\b|SET\s+(LOCAL\s+)?\w+\s*(=|TO)|CREATE\s+(TABLE|INDEX|FUNCTION|DATABASE)|DROP\s+\w+|ALTER\s+TABLE|LOCK\s+TABLE)/;

interface Literal {
  kind: 'template' | 'string';
  text: string;
  line: number;
  /** The text right after the literal, to see a `+` concatenation. */
  after: string;
  before: string;
}

/** Every string and template literal of a TypeScript source, with its line. */
export function literalsOf(source: string): Literal[] {
  const literals: Literal[] = [];
  let i = 0;
  let line = 1;
  const at = (start: number, end: number, kind: Literal['kind'], startLine: number) => {
    literals.push({
      kind,
      text: source.slice(start, end),
      line: startLine,
      after: source.slice(end + 1, end + 12),
      before: source.slice(Math.max(0, start - 12), start - 1),
    });
  };
  const skipTemplate = (): void => {
    // i is just after the opening backtick
    const start = i;
    const startLine = line;
    let depth = 0;
    while (i < source.length) {
      const ch = source[i]!;
      if (ch === '\n') line += 1;
      if (ch === '\\') {
        i += 2;
        continue;
      }
      if (depth === 0 && ch === '`') {
        at(start, i, 'template', startLine);
        i += 1;
        return;
      }
      if (ch === '$' && source[i + 1] === '{') {
        depth += 1;
        i += 2;
        continue;
      }
      if (depth > 0 && ch === '}') depth -= 1;
      if (depth > 0 && ch === '`') {
        i += 1;
        skipTemplate();
        continue;
      }
      i += 1;
    }
  };
  while (i < source.length) {
    const ch = source[i]!;
    const next = source[i + 1];
    if (ch === '\n') {
      line += 1;
      i += 1;
    } else if (ch === '/' && next === '/') {
      while (i < source.length && source[i] !== '\n') i += 1;
    } else if (ch === '/' && next === '*') {
      i += 2;
      while (i < source.length && !(source[i] === '*' && source[i + 1] === '/')) {
        if (source[i] === '\n') line += 1;
        i += 1;
      }
      i += 2;
    } else if (ch === "'" || ch === '"') {
      const start = i + 1;
      i += 1;
      while (i < source.length && source[i] !== ch && source[i] !== '\n') i += source[i] === '\\' ? 2 : 1;
      at(start, i, 'string', line);
      i += 1;
    } else if (ch === '`') {
      i += 1;
      skipTemplate();
    } else {
      i += 1;
    }
  }
  return literals;
}

/** SQL-looking literals that are built: a template with a substitution, or a string concatenated. */
export function builtSqlIn(file: string, source: string): SqlFinding[] {
  const findings: SqlFinding[] = [];
  for (const literal of literalsOf(source)) {
    if (!SQL_STATEMENT.test(literal.text)) continue;
    const substituted = literal.kind === 'template' && literal.text.includes('${');
    const concatenated = /^\s*\+/.test(literal.after) || /\+\s*$/.test(literal.before);
    if (!substituted && !concatenated) continue;
    const reviewed = REVIEWED_EXCEPTIONS.some(
      (exception) => exception.file === file && literal.text.startsWith(exception.startsWith),
    );
    if (reviewed) continue;
    findings.push({ file, line: literal.line, text: literal.text.replace(/\s+/g, ' ').slice(0, 160) });
  }
  return findings;
}

async function sourcesUnder(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true, recursive: true });
  return entries
    .filter((entry) => entry.isFile() && entry.name.endsWith('.ts'))
    .map((entry) => join(entry.parentPath, entry.name));
}

/** Scans functions/**\/*.ts; also reports whether the reviewed exception is still where it was. */
export async function scanFunctionsForBuiltSql(): Promise<{
  files: number;
  findings: SqlFinding[];
  reviewedExceptionsPresent: number;
}> {
  const files = await sourcesUnder(join(ROOT, 'functions'));
  const findings: SqlFinding[] = [];
  let reviewedExceptionsPresent = 0;
  for (const path of files) {
    const file = relative(ROOT, path);
    const source = await readFile(path, 'utf8');
    findings.push(...builtSqlIn(file, source));
    for (const literal of literalsOf(source)) {
      if (REVIEWED_EXCEPTIONS.some((e) => e.file === file && literal.text.startsWith(e.startsWith))) {
        reviewedExceptionsPresent += 1;
      }
    }
  }
  return { files: files.length, findings, reviewedExceptionsPresent };
}
