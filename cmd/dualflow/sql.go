package main

import (
	"context"
	"errors"
)

func runSQL(ctx context.Context, args []string) error { return errors.New("sql: work in progress") }
