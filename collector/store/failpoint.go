package store

// FailpointEnv names the environment variable of the writer's failpoint,
// compiled in only with the build tag dualflow_failpoints (the e2e crash
// test's binary; see failpoint_on.go): FailpointEnv=kill-after-insert makes
// the process SIGKILL itself once the first journaled batch is delivered
// (inserted or spooled) and before its acknowledgement, the window a crash
// leaves a stored batch unacknowledged, which the test must hit every
// time, not by chance. The product's binary has no failpoint: without the
// tag, killAfterInsert is the constant false and the code is removed.
const FailpointEnv = "DUALFLOW_FAILPOINT"
