'use strict';

/**
 * A stage's settings, from the repository and never from the packaging shell: serverless.yml's
 * `params` (the stage's block over `default`), or an explicit `--param="name=value"` on the command
 * line, which osls puts first. `FENCE_SWEEP_AFTER_SECONDS=20 osls package --stage prod` used to bake
 * 20 into prod because this file read `process.env`; now the same commit packages the same
 * template whoever runs it (test/integration/template-stage-settings.test.ts).
 *
 * Two kinds of param:
 * - UPPER_CASE ones are the functions' configuration variables (docs/integration.md, section 4):
 *   every tunable of functions/adapters/config.ts, LOG_LEVEL and DATABASE_DRIVER. Each lands in
 *   every function's environment under its own name, validated by the functions' own rules.
 * - camelCase ones shape the infrastructure: region, architecture, the private network, the
 *   provisioner token, the alarm subscription, local endpoints.
 *
 * A name that is neither is refused, in the command line and in any stage's block: a misspelt
 * `FENCE_SWEEP_AFTER_SECOND` would otherwise be ignored and the default deployed.
 */
const { effectiveConfiguration, projectFacts } = require('./project.cjs');

/** The infrastructure params, each with the rule its value must follow. */
const INFRASTRUCTURE_PARAMS = {
  region: 'the AWS region the stage deploys to (--region overrides it)',
  architecture: 'arm64 or x86_64',
  alarmSubscription: 'an email address or an https:// URL, or empty (alarms.cjs)',
  vpcSubnetIds: 'subnet ids (subnet-…), a list or comma-separated; empty for no private network',
  vpcSecurityGroupIds: 'security group ids (sg-…), a list or comma-separated; empty for no private network',
  provisionerToken: 'true or false',
  awsEndpointUrl: 'an http:// or https:// URL the functions reach AWS APIs at (LocalStack), or empty',
};

/** Powertools' log levels (functions/adapters/observability.ts passes LOG_LEVEL to its logger). */
const LOG_LEVELS = ['TRACE', 'DEBUG', 'INFO', 'WARN', 'ERROR', 'CRITICAL', 'SILENT'];
/** Contract v1.2, section 4: unset means by the database URL's host. */
const DATABASE_DRIVERS = ['neon', 'tcp'];
const ARCHITECTURES = ['arm64', 'x86_64'];
/** Lambda's limits on VpcConfig (16 subnets, 5 security groups). */
const VPC_LIMITS = { subnet: 16, 'security group': 5 };
const SUBNET_ID = /^subnet-[0-9a-f]{8}(?:[0-9a-f]{9})?$/;
const SECURITY_GROUP_ID = /^sg-[0-9a-f]{8}(?:[0-9a-f]{9})?$/;

class StageParamError extends Error {
  /**
   * @param {string} name the param
   * @param {unknown} value as given
   * @param {string} rule what it must be
   */
  constructor(name, value, rule) {
    super(`param ${name}="${value}" is invalid: ${rule}`);
    this.name = 'StageParamError';
    this.code = 'STAGE_PARAM_INVALID';
  }
}

/** Every param name a stage may set. */
function knownParams() {
  return new Set([
    ...Object.keys(INFRASTRUCTURE_PARAMS),
    ...Object.keys(projectFacts().CONFIG_DEFAULTS),
    'LOG_LEVEL',
    'DATABASE_DRIVER',
  ]);
}

/**
 * Refuses a param name nobody reads, wherever it is set: any stage's block (not only the one being
 * packaged, so a typo in prod's block fails every packaging) or the command line.
 */
function assertKnownNames(configured, cliParams) {
  const known = knownParams();
  const offenders = [];
  for (const [stage, block] of Object.entries(configured ?? {})) {
    for (const name of Object.keys(block ?? {})) {
      if (!known.has(name)) offenders.push(`params.${stage}.${name}`);
    }
  }
  for (const item of cliParams ?? []) {
    const name = String(item).split('=')[0];
    if (!known.has(name)) offenders.push(`--param="${item}"`);
  }
  if (offenders.length) {
    throw new Error(
      `serverless.yml params: unknown name(s) ${offenders.join(', ')}; a stage may set ${[...known].sort().join(', ')}`,
    );
  }
}

/** `["a", "b"]`, `"a,b"` or `""` → a list of trimmed, non-empty ids. */
function idList(value) {
  if (value === undefined || value === null || value === '') return [];
  const items = Array.isArray(value) ? value : String(value).split(',');
  return items.map((item) => String(item).trim()).filter(Boolean);
}

function vpcIds(name, value, pattern, what) {
  const ids = idList(value);
  const bad = ids.find((id) => !pattern.test(id));
  if (bad !== undefined) throw new StageParamError(name, value, `${bad} is not a ${what} id`);
  if (ids.length > VPC_LIMITS[what]) {
    throw new StageParamError(name, value, `Lambda takes at most ${VPC_LIMITS[what]} ${what} ids`);
  }
  if (new Set(ids).size !== ids.length) throw new StageParamError(name, value, `a ${what} id is repeated`);
  return ids;
}

/**
 * The private network, or undefined. Lambda needs both lists: subnets without security groups (or
 * the reverse) would be dropped by osls without a word and the functions deployed outside the VPC.
 */
function privateNetwork(subnetValue, securityGroupValue) {
  const subnetIds = vpcIds('vpcSubnetIds', subnetValue, SUBNET_ID, 'subnet');
  const securityGroupIds = vpcIds(
    'vpcSecurityGroupIds',
    securityGroupValue,
    SECURITY_GROUP_ID,
    'security group',
  );
  if (!subnetIds.length && !securityGroupIds.length) return undefined;
  if (!subnetIds.length) {
    throw new StageParamError(
      'vpcSubnetIds',
      subnetValue ?? '',
      'must name the subnets too: vpcSecurityGroupIds is set',
    );
  }
  if (!securityGroupIds.length) {
    throw new StageParamError(
      'vpcSecurityGroupIds',
      securityGroupValue ?? '',
      'must name the security groups too: vpcSubnetIds is set',
    );
  }
  return { subnetIds, securityGroupIds };
}

function oneOf(name, value, allowed, { optional = false } = {}) {
  const text = value === undefined || value === null ? '' : String(value).trim();
  if (text === '' && optional) return undefined;
  if (!allowed.includes(text)) {
    throw new StageParamError(
      name,
      value ?? '',
      `must be ${allowed.join(' or ')}${optional ? ', or empty' : ''}`,
    );
  }
  return text;
}

function booleanParam(name, value) {
  if (value === true || value === 'true') return true;
  if (value === false || value === 'false' || value === undefined || value === null || value === '')
    return false;
  throw new StageParamError(name, value, 'must be true or false');
}

function endpointUrl(name, value) {
  const text = value === undefined || value === null ? '' : String(value).trim();
  if (!text) return undefined;
  let url;
  try {
    url = new URL(text);
  } catch {}
  if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:')) {
    throw new StageParamError(name, value, 'must be an http:// or https:// URL, or empty');
  }
  return url.origin;
}

/**
 * The params a stage's settings are made of: every name a stage may set (knownParams, the one list
 * the names are checked against), but `region`, which osls reads itself (`provider.region`).
 */
function paramsRead() {
  return [...knownParams()].filter((name) => name !== 'region');
}

/**
 * What osls hands a `${file(…)}` function, read into plain values for `settingsOf`: the names
 * are checked before any value is resolved.
 *
 * @param {{ resolveVariable: (variable: string) => Promise<unknown>, options: { param?: string[] } }} osls
 */
async function stageSettings({ resolveVariable, options }) {
  assertKnownNames(await resolveVariable('self:params, null'), options?.param);
  const stage = await resolveVariable('sls:stage');
  const params = {};
  for (const name of paramsRead()) {
    const value = await resolveVariable(`param:${name}, null`);
    if (value !== null && value !== undefined) params[name] = value;
  }
  return settingsOf(stage, params);
}

/**
 * A stage's settings from its resolved params (a name → value map, unset ones absent), or the
 * first rule one of them breaks, as a StageParamError or the functions' own configuration error.
 * Pure: the rules are tested on it directly (test/unit/stage-settings.test.ts), and through osls
 * in test/integration/template-stage-settings.test.ts.
 *
 * @param {string} stage
 * @param {Record<string, unknown>} params
 */
function settingsOf(stage, params) {
  const { CONFIG_DEFAULTS } = projectFacts();
  const configured = {};
  for (const name of Object.keys(CONFIG_DEFAULTS)) {
    const value = params[name];
    if (value !== undefined && value !== null && value !== '') configured[name] = String(value);
  }
  // The functions' own rules (config.ts), so a value that would stop them at cold start stops
  // packaging instead, with the same line: `NAME="value" is invalid: <rule>`.
  const config = effectiveConfiguration(configured);
  return {
    stage,
    config,
    logLevel: oneOf('LOG_LEVEL', params.LOG_LEVEL ?? 'INFO', LOG_LEVELS),
    databaseDriver: oneOf('DATABASE_DRIVER', params.DATABASE_DRIVER, DATABASE_DRIVERS, { optional: true }),
    architecture: oneOf('architecture', params.architecture ?? 'arm64', ARCHITECTURES),
    privateNetwork: privateNetwork(params.vpcSubnetIds, params.vpcSecurityGroupIds),
    provisionerToken: booleanParam('provisionerToken', params.provisionerToken),
    awsEndpointUrl: endpointUrl('awsEndpointUrl', params.awsEndpointUrl),
    alarmSubscription: params.alarmSubscription ?? '',
  };
}

module.exports = {
  stageSettings,
  settingsOf,
  assertKnownNames,
  StageParamError,
  INFRASTRUCTURE_PARAMS,
  idList,
};
