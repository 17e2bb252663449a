'use strict';

/**
 * CloudFormation logical IDs, shared by every generator here and by serverless.yml (which names
 * the per-function roles). osls derives a function's own IDs from its key: `fenceCheck` →
 * `FenceCheckLambdaFunction`, `FenceCheckLogGroup`.
 */

/** `run-finished` → `RunFinished`, `runtime-release.fifo` → `RuntimeRelease`. */
function pascal(name) {
  return name
    .replace(/\.fifo$/, '')
    .split(/[^A-Za-z0-9]+/)
    .filter(Boolean)
    .map((part) => part[0].toUpperCase() + part.slice(1))
    .join('');
}

const queueLogicalId = (queueName) => `${pascal(queueName)}Queue`;
const deadLetterQueueLogicalId = (queueName) => `${pascal(queueName)}DeadLetterQueue`;
const functionRoleLogicalId = (functionKey) => `${pascal(functionKey)}Role`;
const functionLogicalId = (functionKey) => `${pascal(functionKey)}LambdaFunction`;
const logGroupLogicalId = (functionKey) => `${pascal(functionKey)}LogGroup`;

module.exports = {
  pascal,
  queueLogicalId,
  deadLetterQueueLogicalId,
  functionRoleLogicalId,
  functionLogicalId,
  logGroupLogicalId,
};
