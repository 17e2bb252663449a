/**
 * What the JSON object of a `200` to `DELETE /api/sandboxes/{id}` says about the delete: done,
 * not done yet (the provisioner may still carry it out), failed, or about another sandbox.
 *
 * Provisioners answer in many shapes: a flat `{"status": "deleted"}`, a framework's envelope
 * (`{"data": {...}}`, JSON:API's `{"data": {"attributes": {...}}}`), Go structs without JSON tags
 * (`{"Status": ...}`), a long-running operation (`{"done": false}`), a Kubernetes object whose
 * finalizers are still pending, a `{"code": 1, "msg": ...}` failure. The body is walked as a tree
 * (bounded), keys compared without case, and the answer is, in this order:
 *
 * 1. not yet, if anything in it says the delete is still under way: a `status`/`state`/`phase`
 *    anywhere holding something other than a done or failure word (a number such as `202`, `true`,
 *    `DELETE_IN_PROGRESS`…), `done: false`, `accepted: true`, a `deletionTimestamp`, pending
 *    `finalizers`; or, where no state field is present at all, a free-text field saying so;
 * 2. failed, if anything says the operation failed (`ok`/`success`/`deleted` false, an `error` set,
 *    a failure word, a status or code of an error);
 * 3. about another sandbox, if the body or its envelope names another id or generation;
 * 4. else done.
 *
 * Why "not yet" wins: a wrong "done" clears a fence while the provisioner is still deleting (a run
 * admitted meanwhile is handed the container and loses it); a wrong "not yet" keeps the scope
 * quarantined a retry longer. Free text is read only when no state field exists, so an explicit
 * done word is not overridden by a message that happens to mention "pending".
 */

export interface DeleteAnswerRefusal {
  readonly refusal: string;
  /** The provisioner said the delete is still to happen: it may still act. */
  readonly notYet?: boolean;
  /** The provisioner said the delete failed (its explanation may be worth showing). */
  readonly failed?: boolean;
}

export interface DeleteTarget {
  readonly sandboxId: string;
  readonly generation: number;
}

/**
 * `status`/`state`/`phase` words that say the delete is done (or that there was nothing to
 * delete); compared after lower-casing and turning spaces and dashes into `_`. The list of "not
 * done yet" words is open-ended, the list of "done" words is not, so the rule is an allow-list.
 */
export const DONE_WORDS: ReadonlySet<string> = new Set([
  'deleted',
  'already_deleted',
  'deleted_successfully',
  'successfully_deleted',
  'delete_complete',
  'delete_completed',
  'deletion_complete',
  'gone',
  'removed',
  'destroyed',
  'terminated',
  'absent',
  'not_found',
  'notfound',
  'no_such_sandbox',
  'does_not_exist',
  'ok',
  '200',
  '200_ok',
  '204',
  '204_no_content',
  'success',
  'successful',
  'succeeded',
  'done',
  'complete',
  'completed',
]);

export const FAILED_WORDS: ReadonlySet<string> = new Set([
  'failed',
  'failure',
  'error',
  'errored',
  'rejected',
  'delete_failed',
  'deletion_failed',
]);

const STATE_KEYS = new Set(['status', 'state', 'phase']);
/** Free text that may say the delete is under way, read only when no state field exists. */
const TEXT_KEYS = new Set(['message', 'msg', 'detail', 'description', 'data', 'result']);
const UNDER_WAY_TEXT =
  /\b(in[\s_-]?progress|being[\s_-]deleted|deleting|pending|queued|scheduled|terminating|shutting[\s_-]?down|stopping|accepted|started|initiated|requested|will[\s_-]be|marked[\s_-]for)\b/i;
/** Envelopes whose fields name the sandbox as if at the top: `{"data": {"sandbox_id": …}}`. */
const ENVELOPE_KEYS = new Set(['data', 'result', 'sandbox']);

/**
 * How deep and how wide the walk goes: deep enough for JSON:API and operations, bounded for a
 * hostile body. A body with more fields than the walk reads cannot be judged, so it is "not yet"
 * (what it hides may say "deleting"); fields below MAX_DEPTH are not read.
 */
const MAX_DEPTH = 8;
const MAX_FIELDS = 10_000;

interface Field {
  readonly path: string;
  /** The key, lower-cased. */
  readonly key: string;
  readonly value: unknown;
}

/**
 * Every (key, value) of the body, depth-first, to MAX_DEPTH levels; undefined when it has more
 * than MAX_FIELDS.
 */
function fieldsOf(body: Record<string, unknown>): Field[] | undefined {
  const fields: Field[] = [];
  let truncated = false;
  const visit = (value: unknown, path: string, depth: number) => {
    if (depth > MAX_DEPTH || truncated) return;
    if (Array.isArray(value)) {
      value.forEach((item, index) => {
        visit(item, `${path}[${index}]`, depth + 1);
      });
      return;
    }
    if (typeof value !== 'object' || value === null) return;
    for (const [key, inner] of Object.entries(value)) {
      if (fields.length >= MAX_FIELDS) {
        truncated = true;
        return;
      }
      const at = path === '' ? key : `${path}.${key}`;
      fields.push({ path: at, key: key.toLowerCase(), value: inner });
      visit(inner, at, depth + 1);
    }
  };
  visit(body, '', 0);
  return truncated ? undefined : fields;
}

export function stateWord(value: unknown): string | undefined {
  return typeof value === 'string'
    ? value
        .trim()
        .toLowerCase()
        .replace(/[\s-]+/g, '_')
    : undefined;
}

const shown = (value: unknown) => (JSON.stringify(value) ?? String(value)).slice(0, 60);

/** Why a 200's JSON object does not confirm the delete, or undefined when it does. */
export function judgeDeleteAnswer(
  body: Record<string, unknown>,
  target: DeleteTarget,
): DeleteAnswerRefusal | undefined {
  const fields = fieldsOf(body);
  if (fields === undefined) {
    return { refusal: `body has more than ${MAX_FIELDS} fields: it cannot be judged`, notYet: true };
  }
  const pending = stillUnderWay(fields);
  if (pending !== undefined)
    return { refusal: `body says ${pending}: the delete is not confirmed done`, notYet: true };
  const failure = reportedFailure(fields);
  if (failure !== undefined) return { refusal: `body reports a failure (${failure})`, failed: true };
  const mismatch = namesAnotherSandbox(body, target);
  if (mismatch !== undefined) return { refusal: mismatch };
  return undefined;
}

function stillUnderWay(fields: readonly Field[]): string | undefined {
  let anyState = false;
  for (const { path, key, value } of fields) {
    if (STATE_KEYS.has(key)) {
      if (value === undefined || value === null) continue;
      anyState = true;
      // An object is walked into (`{"status": {"phase": …}}`); its own fields decide.
      if (typeof value === 'object' && !Array.isArray(value)) continue;
      if (typeof value === 'number' && (value === 200 || value === 204 || value >= 400)) continue;
      if (value === false) continue; // a failure, reportedFailure's
      const word = stateWord(value);
      if (word !== undefined && (DONE_WORDS.has(word) || FAILED_WORDS.has(word))) continue;
      return `${path} ${shown(value)}`;
    }
    if (key === 'done' && value === false) return `${path} false`;
    if (key === 'accepted' && value === true) return `${path} true`;
    if (
      (key === 'deletiontimestamp' || key === 'deletion_timestamp') &&
      typeof value === 'string' &&
      value !== ''
    ) {
      return `${path} ${shown(value)} (deletion under way)`;
    }
    if (key === 'finalizers' && Array.isArray(value) && value.length > 0) {
      return `${path} ${shown(value)} (finalizers pending)`;
    }
  }
  if (anyState) return undefined;
  for (const { path, key, value } of fields) {
    if (TEXT_KEYS.has(key) && typeof value === 'string' && UNDER_WAY_TEXT.test(value)) {
      return `${path} ${JSON.stringify(value.slice(0, 80))}`;
    }
  }
  return undefined;
}

const isFalse = (value: unknown) =>
  value === false || (typeof value === 'string' && value.trim().toLowerCase() === 'false');

function isSet(value: unknown): boolean {
  if (value === undefined || value === null || value === false || value === '') return false;
  return !(typeof value === 'object' && Object.keys(value).length === 0);
}

/**
 * A body that says, in the usual ways, that the operation failed: `ok`/`success`/`deleted` false,
 * an `error` that is set, a non-empty `errors` list (GraphQL, JSON:API), a failed state word, a
 * `status`/`statusCode` of an HTTP error, or a `code` other than 0/200/204 (the `{"code": 1,
 * "msg": …}` convention). A gateway or framework that wraps every answer in a 200 reports failures
 * like this; counting it as deleted would clear a fence over a live sandbox.
 */
function reportedFailure(fields: readonly Field[]): string | undefined {
  for (const { path, key, value } of fields) {
    if ((key === 'ok' || key === 'success' || key === 'deleted') && isFalse(value)) return `${path}: false`;
    if (key === 'error' && isSet(value)) return `${path} is set`;
    if (key === 'errors' && (Array.isArray(value) ? value.length > 0 : isSet(value))) return `${path} is set`;
    if (STATE_KEYS.has(key)) {
      const word = stateWord(value);
      if (value === false || (word !== undefined && FAILED_WORDS.has(word))) return `${path} ${shown(value)}`;
    }
    if (
      (STATE_KEYS.has(key) || key === 'statuscode' || key === 'status_code') &&
      typeof value === 'number' &&
      value >= 400
    ) {
      return `${path} ${value}`;
    }
    if (key === 'code' && typeof value === 'number' && value !== 0 && value !== 200 && value !== 204) {
      return `${path} ${value}`;
    }
  }
  return undefined;
}

/**
 * A confirmation of ANOTHER delete: the body, or an envelope of it (`data`, `result`, `sandbox`),
 * names a sandbox or a generation that is not the one asked for (a proxy mixing answers up, a
 * provisioner ignoring `?generation=`). `generation` may be a number or a string of digits; inside
 * a `sandbox` envelope, `id` names the sandbox too.
 */
function namesAnotherSandbox(body: Record<string, unknown>, target: DeleteTarget): string | undefined {
  const scopes: Array<{ where: string; record: Record<string, unknown>; idKeys: string[] }> = [
    { where: 'body', record: body, idKeys: ['sandbox_id'] },
  ];
  for (const [key, value] of Object.entries(body)) {
    const lower = key.toLowerCase();
    if (!ENVELOPE_KEYS.has(lower) || typeof value !== 'object' || value === null || Array.isArray(value))
      continue;
    scopes.push({
      where: `body's ${key}`,
      record: value as Record<string, unknown>,
      idKeys: lower === 'sandbox' ? ['sandbox_id', 'id'] : ['sandbox_id'],
    });
  }
  for (const { where, record, idKeys } of scopes) {
    for (const idKey of idKeys) {
      const named = record[idKey];
      if (named !== undefined && named !== null && named !== target.sandboxId) {
        return `${where} names sandbox ${JSON.stringify(String(named).slice(0, 80))}, not the one being deleted`;
      }
    }
    const generation = record.generation;
    if (generation === undefined || generation === null) continue;
    const value =
      typeof generation === 'string' && /^\d+$/.test(generation) ? Number(generation) : generation;
    if (value !== target.generation) {
      return `${where} names generation ${JSON.stringify(generation)}, not the generation ${target.generation} being deleted`;
    }
  }
  return undefined;
}
