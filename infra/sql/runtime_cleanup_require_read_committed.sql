-- Called first by every decision function (phase 1, the release guard, finalize, force-clear, the
-- reclaim guard; test/unit/sql-rules.test.ts checks each one does).
--
-- Each decision re-reads, under the scope's advisory lock, what whoever held the lock before it
-- committed. PL/pgSQL gives each statement of a VOLATILE function a fresh snapshot only under READ
-- COMMITTED: under REPEATABLE READ or SERIALIZABLE the whole function would decide on the snapshot
-- taken when the call began, before the lock was granted. A database or role with
-- `default_transaction_isolation = 'repeatable read'` would silently break the guard, so the
-- decisions refuse any other level (SQLSTATE 25000). An autocommit statement under the default
-- level, and `BEGIN ISOLATION LEVEL READ COMMITTED` (what the project's adapter sends), pass.
CREATE OR REPLACE FUNCTION runtime_cleanup_require_read_committed() RETURNS void
  LANGUAGE plpgsql VOLATILE
  AS $$
  BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
      RAISE EXCEPTION 'runtime cleanup decisions need READ COMMITTED; this transaction is %',
          upper(current_setting('transaction_isolation'))
        USING ERRCODE = 'invalid_transaction_state',
              HINT = 'Begin the transaction with BEGIN ISOLATION LEVEL READ COMMITTED: under a higher level a decision would read a snapshot taken before its locks were granted.';
    END IF;
  END
  $$;
