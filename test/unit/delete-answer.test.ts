/**
 * What a 200's JSON object says about a delete (functions/adapters/delete-answer.ts), over the
 * shapes real provisioners answer in: flat, enveloped, JSON:API, Go structs, long-running
 * operations, Kubernetes objects, `{code, msg}` conventions. A wrong "done" clears a fence over a
 * sandbox that is still being deleted or was never deleted; each "not yet" and "failed" row below
 * was once (or would be, without the walk) read as done.
 */
import { describe, expect, it } from 'vitest';
import { judgeDeleteAnswer } from '../../functions/adapters/delete-answer.ts';

const target = { sandboxId: 'sbx', generation: 3 };
const judge = (body: string) => judgeDeleteAnswer(JSON.parse(body) as Record<string, unknown>, target);

describe('a delete still under way is "not yet" (the provisioner may still act)', () => {
  it.each([
    '{"status":"deleting"}',
    '{"Status":"DELETE_IN_PROGRESS"}',
    '{"ID":"sbx","Status":"deleting"}',
    '{"status":202}',
    '{"status":true}',
    '{"status":{"phase":"Terminating"}}',
    '{"data":{"status":"deleting"}}',
    '{"data":{"type":"sandboxes","id":"sbx","attributes":{"status":"deleting"}}}',
    '{"data":{"sandbox":{"status":"deleting"}}}',
    '{"data":[{"status":"deleting"}]}',
    '{"status":"success","job":{"status":"queued"}}',
    '{"status":"ok","operation":{"state":"RUNNING"}}',
    '{"TerminatingInstances":[{"CurrentState":{"Name":"shutting-down"}}],"state":"shutting-down"}',
    '{"name":"operations/del-123","done":false,"metadata":{"verb":"delete"}}',
    '{"accepted":true}',
    '{"kind":"Sandbox","metadata":{"deletionTimestamp":"2026-12-05T08:00:00Z","finalizers":["x"]},"spec":{}}',
    '{"metadata":{"finalizers":["sandbox.example/cleanup"]}}',
    '{"message":"Sandbox is being deleted"}',
    '{"message":"Delete request accepted"}',
    '{"message":"deletion started"}',
    '{"message":"Deletion requested"}',
    '{"msg":"marked for deletion"}',
    '{"detail":"Sandbox sbx will be deleted"}',
    '{"result":"deletion started"}',
    '{"result":"scheduled for deletion"}',
  ])('%s', (body) => {
    expect(judge(body)).toMatchObject({ notYet: true });
  });
});

describe('a delete that failed is refused, not retried as "not yet"', () => {
  it.each([
    '{"state":"failed"}',
    '{"phase":"Failed"}',
    '{"state":"ERROR","message":"could not delete: volume busy"}',
    '{"data":{"state":"failed"}}',
    '{"sandbox_id":"sbx","generation":3,"status":"deleted","state":"error"}',
    '{"code":500,"msg":"delete failed: timeout","data":null}',
    '{"code":1,"message":"sandbox busy"}',
    '{"Error":"sandbox busy"}',
    '{"success":"false"}',
    '{"deleted":false}',
    '{"status":500}',
    '{"result":{"deleted":false}}',
    '{"errors":[{"title":"nope"}]}',
  ])('%s', (body) => {
    expect(judge(body)).toMatchObject({ failed: true });
    expect(judge(body)?.notYet).toBeUndefined();
  });
});

describe('an answer about another sandbox or generation is refused', () => {
  it.each([
    '{"sandbox_id":"other","status":"deleted"}',
    '{"generation":2,"deleted":true}',
    '{"data":{"sandbox_id":"other","status":"deleted"}}',
    '{"sandbox":{"id":"other","status":"deleted"}}',
    '{"result":{"generation":2,"deleted":true}}',
  ])('%s', (body) => {
    const verdict = judge(body);
    expect(verdict?.refusal).toMatch(/names (sandbox|generation)/);
    expect(verdict?.notYet).toBeUndefined();
  });
});

describe('a confirmation is done', () => {
  it.each([
    '{}',
    '{"deleted":true,"generation":3}',
    '{"status":"deleted"}',
    '{"status":"already_deleted"}',
    '{"status":"DELETE_COMPLETE"}',
    '{"status":"SUCCESSFUL"}',
    '{"status":"Deleted successfully"}',
    '{"status":"no_such_sandbox"}',
    '{"status":"204"}',
    '{"status":"200 OK"}',
    '{"status":200}',
    '{"data":{"status":"deleted"}}',
    '{"result":"ok","status":null}',
    '{"code":0,"msg":"ok"}',
    '{"sandbox":{"id":"sbx","status":"deleted"}}',
    // An explicit done word is not overridden by free text that mentions "pending".
    '{"status":"deleted","message":"Sandbox deleted; pending billing records cleared"}',
    '{"status":"deleted","result":"pending cleanup of logs"}',
    // The platform's provisioner (a FastAPI app) answers with a message and no state field.
    '{"sandbox_id":"sbx","message":"sandbox deleted"}',
    '{"sandbox_id":"sbx","message":"sandbox not found, nothing to delete"}',
  ])('%s', (body) => {
    expect(judge(body)).toBeUndefined();
  });
});

it('walks a bounded tree: a deep body is judged without blowing the stack, one too wide to read is "not yet"', () => {
  let deep: unknown = { status: 'deleting' };
  for (let i = 0; i < 10_000; i += 1) deep = { data: deep };
  expect(() => judgeDeleteAnswer(deep as Record<string, unknown>, target)).not.toThrow();
  const wide = Object.fromEntries(Array.from({ length: 50_000 }, (_, i) => [`k${i}`, i]));
  expect(judgeDeleteAnswer({ ...wide, status: 'deleting' }, target)).toMatchObject({ notYet: true });
  expect(judgeDeleteAnswer(wide, target)).toMatchObject({ notYet: true });
});
