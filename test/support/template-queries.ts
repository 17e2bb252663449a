/**
 * Questions a test asks of a packaged CloudFormation template: a resource by logical id, a
 * function's resource and environment by its key, a queue's base name (its physical name without
 * the stage prefix), the event source mappings, what a function's role allows on which queue, the
 * alarms and the dashboard's metrics. Every lookup that finds nothing throws, naming what it
 * looked for, so a test never asserts on `undefined`.
 */
import { METRICS_NAMESPACE } from '../../functions/adapters/metric-names.ts';
import {
  type CfnResource,
  type CfnTemplate,
  referencedLogicalId,
  resourcesOfType,
  substituteForInspection,
} from './packaged-template.ts';

export interface Mapping<Key extends string> {
  functionKey: Key;
  queue: string;
  properties: Record<string, unknown>;
}

export interface Statement {
  Effect: string;
  Action: string | string[];
  Resource: unknown;
}

export interface DashboardWidget {
  type: string;
  properties: { title?: string; metrics?: unknown[][]; alarms?: string[] };
}

export const asList = <T>(value: T | T[]): T[] => (Array.isArray(value) ? value : [value]);

export class TemplateQueries<Key extends string> {
  /** Physical names of the stage's queues start with this (`<stage>-`). */
  readonly prefix: string;

  constructor(
    private readonly template: CfnTemplate,
    private readonly options: { service: string; stage: string; functionKeys: readonly Key[] },
  ) {
    this.prefix = `${options.stage}-`;
  }

  resource(logicalId: string): CfnResource {
    const found = this.template.Resources[logicalId];
    if (!found) throw new Error(`no resource ${logicalId} in the template`);
    return found;
  }

  props(logicalId: string): Record<string, unknown> {
    return this.resource(logicalId).Properties ?? {};
  }

  /** The Lambda function resource of a function key (osls names it `<service>-<stage>-<key>`). */
  lambdaFunction(key: Key): { id: string; properties: Record<string, unknown> } {
    const name = `${this.options.service}-${this.options.stage}-${key}`;
    const found = resourcesOfType(this.template, 'AWS::Lambda::Function').find(
      ([, candidate]) => candidate.Properties?.FunctionName === name,
    );
    if (!found) throw new Error(`no Lambda function named ${name}`);
    return { id: found[0], properties: found[1].Properties ?? {} };
  }

  functionKeyOf(logicalId: string): Key {
    const key = this.options.functionKeys.find(
      (candidate) => this.lambdaFunction(candidate).id === logicalId,
    );
    if (!key)
      throw new Error(`${logicalId} is not one of the functions ${this.options.functionKeys.join(', ')}`);
    return key;
  }

  /** A queue resource's base name: its physical name without the stage prefix (which it must carry). */
  queueBaseName(logicalId: string): string {
    const name = String(this.props(logicalId).QueueName);
    if (!name.startsWith(this.prefix))
      throw new Error(`${name} does not carry the stage prefix ${this.prefix}`);
    return name.slice(this.prefix.length);
  }

  queueLogicalIdByBaseName(baseName: string): string {
    const found = resourcesOfType(this.template, 'AWS::SQS::Queue').find(
      ([, queue]) => queue.Properties?.QueueName === `${this.prefix}${baseName}`,
    );
    if (!found) throw new Error(`no queue named ${this.prefix}${baseName}`);
    return found[0];
  }

  eventSourceMappings(): Mapping<Key>[] {
    return resourcesOfType(this.template, 'AWS::Lambda::EventSourceMapping').map(([, mapping]) => {
      const properties = mapping.Properties ?? {};
      return {
        functionKey: this.functionKeyOf(referencedLogicalId(properties.FunctionName)!),
        queue: this.queueBaseName(referencedLogicalId(properties.EventSourceArn)!),
        properties,
      };
    });
  }

  roleStatements(roleLogicalId: string): Statement[] {
    const policies = (this.props(roleLogicalId).Policies ?? []) as Array<{
      PolicyDocument: { Statement: Statement[] };
    }>;
    return policies.flatMap((policy) => policy.PolicyDocument.Statement);
  }

  /** Queue base names a function's role allows `action` on. */
  queuesAllowed(key: Key, action: string): string[] {
    const roleId = referencedLogicalId(this.lambdaFunction(key).properties.Role)!;
    const queues = this.roleStatements(roleId)
      .filter((statement) => statement.Effect === 'Allow' && asList(statement.Action).includes(action))
      .flatMap((statement) => asList(statement.Resource))
      .map((arn) => this.queueBaseName(referencedLogicalId(arn)!));
    return [...new Set(queues)].sort();
  }

  environmentOf(key: Key): Record<string, string> {
    return ((this.lambdaFunction(key).properties.Environment as { Variables?: Record<string, string> })
      ?.Variables ?? {}) as Record<string, string>;
  }

  alarms(): Array<[string, Record<string, unknown>]> {
    return resourcesOfType(this.template, 'AWS::CloudWatch::Alarm').map(([id, alarm]) => [
      id,
      alarm.Properties ?? {},
    ]);
  }

  alarmOnQueue(metric: string, queueBase: string): Record<string, unknown> | undefined {
    return this.alarms().find(([, alarm]) => {
      const dimension = (alarm.Dimensions as Array<{ Name: string; Value: unknown }> | undefined)?.[0];
      return (
        alarm.Namespace === 'AWS/SQS' &&
        alarm.MetricName === metric &&
        dimension?.Name === 'QueueName' &&
        this.queueBaseName(referencedLogicalId(dimension.Value)!) === queueBase
      );
    })?.[1];
  }

  /** Custom metric names an alarm watches: a metric, or the metric inside a Metrics Insights query. */
  customMetricsOfAlarm(alarm: Record<string, unknown>): string[] {
    if (alarm.Namespace === METRICS_NAMESPACE) return [String(alarm.MetricName)];
    const names: string[] = [];
    for (const query of (alarm.Metrics ?? []) as Array<{ Expression?: string }>) {
      const match = query.Expression?.match(/^SELECT \w+\((\w+)\) FROM "?([\w/]+)"?/);
      if (match && match[2] === METRICS_NAMESPACE) names.push(match[1]!);
    }
    return names;
  }

  dashboardWidgets(): DashboardWidget[] {
    const [[, dashboard] = []] = resourcesOfType(this.template, 'AWS::CloudWatch::Dashboard');
    if (!dashboard) throw new Error('no dashboard');
    return (
      JSON.parse(substituteForInspection(dashboard.Properties?.DashboardBody)) as {
        widgets: DashboardWidget[];
      }
    ).widgets;
  }

  /** Each custom metric graphed on the dashboard, with the dimension schema of its SEARCH. */
  dashboardCustomMetrics(): Array<{ metric: string; schema: string[] }> {
    const found: Array<{ metric: string; schema: string[] }> = [];
    for (const widget of this.dashboardWidgets()) {
      for (const line of widget.properties.metrics ?? []) {
        const [first, second] = line;
        if (first === METRICS_NAMESPACE) found.push({ metric: String(second), schema: [] });
        const expression = (first as { expression?: string } | undefined)?.expression;
        const match = expression?.match(/SEARCH\('\{([^}]+)\} MetricName="(\w+)"/);
        if (match) {
          const [namespace, ...schema] = match[1]!.split(',');
          if (namespace === METRICS_NAMESPACE) found.push({ metric: match[2]!, schema });
        }
      }
    }
    return found;
  }
}
