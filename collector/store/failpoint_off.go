//go:build !dualflow_failpoints

package store

const killAfterInsert = false

func killSelf() {}
