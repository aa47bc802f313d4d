package main

import (
	"context"
	"errors"
)

func runMigrate(ctx context.Context, args []string) error { return errors.New("migrate: work in progress") }
