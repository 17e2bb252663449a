/**
 * Reads the project's own documentation for the tests that keep it true: the sections, tables
 * and code blocks of a Markdown file, as plain data.
 */
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';

export const REPO_ROOT = fileURLToPath(new URL('../../', import.meta.url));

export async function readDoc(path: string): Promise<string> {
  return readFile(new URL(path, `file://${REPO_ROOT}`), 'utf8');
}

/** The text of the `## <number>.` section (up to the next `## `), or throws naming it. */
export function section(markdown: string, number: number): string {
  const start = markdown.search(new RegExp(`^## ${number}\\. `, 'm'));
  if (start === -1) throw new Error(`no section "## ${number}." in the document`);
  const rest = markdown.slice(start + 3);
  const end = rest.search(/^## /m);
  return end === -1 ? rest : rest.slice(0, end);
}

/** The rows of every Markdown table in `text`, header and separator lines left out, cells trimmed. */
export function tableRows(text: string): string[][] {
  const rows: string[][] = [];
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i += 1) {
    const line = lines[i]!;
    if (!line.startsWith('|')) continue;
    const isHeader = lines[i + 1]?.startsWith('|---') ?? false;
    if (isHeader || line.startsWith('|---')) continue;
    rows.push(
      line
        .slice(1, line.endsWith('|') ? -1 : undefined)
        .split('|')
        .map((cell) => cell.trim()),
    );
  }
  return rows;
}

/** The first `code` span of a table cell (`` `run-finished` `` → `run-finished`). */
export function codeIn(cell: string): string | undefined {
  return /`([^`]+)`/.exec(cell)?.[1];
}

/** The contents of every fenced code block of a language. */
export function codeBlocks(text: string, language: string): string[] {
  const blocks: string[] = [];
  const pattern = new RegExp(`^\`\`\`${language}\\n([\\s\\S]*?)^\`\`\``, 'gm');
  for (const match of text.matchAll(pattern)) blocks.push(match[1]!);
  return blocks;
}

export interface DocumentedColumn {
  table: string;
  column: string;
  type: string;
}

/**
 * The tables of the `sql` blocks, written `name (` … `)` with one column a line (`name type …`);
 * a table listed in two blocks gets the columns of both.
 */
export function documentedColumns(sql: readonly string[]): DocumentedColumn[] {
  const columns: DocumentedColumn[] = [];
  for (const block of sql) {
    let table: string | undefined;
    for (const line of block.split('\n')) {
      const opens = /^(\w+) \(/.exec(line);
      if (opens) {
        table = opens[1];
        continue;
      }
      if (/^\)/.test(line)) {
        table = undefined;
        continue;
      }
      const column = /^\s+(\w+)\s+(bigint|integer|text|boolean|timestamptz|double precision)\b/.exec(line);
      if (table && column && column[1] !== 'primary') {
        columns.push({ table, column: column[1]!, type: column[2]! });
      }
    }
  }
  return columns;
}
