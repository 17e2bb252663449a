/**
 * Every CloudWatch metric the functions emit, in one list: the code emits these names and the
 * alarms and dashboard in serverless.yml refer to them (a test checks both sides).
 */
export const METRICS_NAMESPACE = 'RuntimeCleanup';

export const MetricName = {
  /** Dimension `outcome`: release_needed | nothing_to_delete | already_clean | deferred | not_owner. */
  FENCE_CHECK_OUTCOME: 'FenceCheckOutcome',
  RELEASE_SUCCEEDED: 'ReleaseSucceeded',
  /** Dimension `errorCode`. */
  RELEASE_FAILED: 'ReleaseFailed',
  /** Dimension `reason`: fence_gone | scope_active | already_released — the guard found the delete no longer wanted. */
  RELEASE_SKIPPED: 'ReleaseSkipped',
  RELEASE_DURATION: 'ReleaseDuration',
  RELEASE_LOCK_WAIT: 'ReleaseLockWait',
  /** Dimension `outcome`: cleared | already_clear | deferred | identity_changed. */
  FINALIZE_OUTCOME: 'FinalizeOutcome',
  /** Fence set → fence cleared. */
  CLEANUP_LATENCY: 'CleanupLatency',
  /** Dimensions `queue`, `reason`. */
  DEAD_LETTERED: 'DeadLettered',
  /** Dimensions `queue`, `errorCode`: an item failed and will come back after a backoff. */
  RETRY_SCHEDULED: 'RetryScheduled',
  PENDING_FENCES: 'PendingFences',
  OLDEST_FENCE_AGE: 'OldestFenceAge',
  FENCES_REANNOUNCED: 'FencesReannounced',
  FORCED_CLEARS: 'ForcedClears',
  /** Records per invocation of a queue consumer. */
  RECORDS_RECEIVED: 'RecordsReceived',
} as const;
export type MetricName = (typeof MetricName)[keyof typeof MetricName];
