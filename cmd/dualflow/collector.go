package main

import (
	"context"
	"errors"
)

func runCollector(ctx context.Context, args []string) error { return errors.New("collector: work in progress") }
