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
  /** The reclaimer: live sandboxes in the provisioner's listing, per run. */
  SANDBOXES_LISTED: 'SandboxesListed',
  /** Listed sandboxes no scope owns now (reclaimed once their streak passes the grace). */
  SANDBOXES_LEAKED: 'SandboxesLeaked',
  /** Dimension `reason` (why it counted as leaked): unrecorded | cleanup_never_ran | kept_after_release | generation_unrecorded. */
  SANDBOXES_RECLAIMED: 'SandboxesReclaimed',
  /**
   * Dimension `reason`: a whole run refused before any DELETE (list_*, share_exceeded or no_known_sandboxes), also
   * emitted without the dimension for the alarm; or one sandbox the guard or the provisioner kept
   * from being reclaimed (scope_active, scope_fenced, delete_in_flight, …, delete_failed).
   */
  RECLAIM_REFUSED: 'ReclaimRefused',
  /**
   * A 404/410 refused because SANDBOX_PROVISIONER_URL is not known to be the provisioner (its
   * listing answered otherwise): every cleanup dead-letters until the URL is fixed. Emitted by
   * the release and the reclaimer, one per refused DELETE.
   */
  PROVISIONER_URL_UNVERIFIED: 'ProvisionerUrlUnverified',
  /**
   * Dimension `brake`: no_known_sandboxes | share_exceeded — a reclaim run went ahead although that
   * brake refused its listing on its own, because a recent healthy listing of the same provisioner
   * vouched for the pairing (a quiet fleet, whose only live sandboxes are leaks).
   */
  RECLAIM_BRAKE_LIFTED: 'ReclaimBrakeLifted',
  /** Age of the oldest open leak streak: grows past the grace only when leaks persist. */
  OLDEST_LEAK_AGE: 'OldestLeakAge',
  /** Records per invocation of a queue consumer. */
  RECORDS_RECEIVED: 'RecordsReceived',
} as const;
export type MetricName = (typeof MetricName)[keyof typeof MetricName];
