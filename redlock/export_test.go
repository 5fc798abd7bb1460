package redlock

import "context"

// Flush returns once every command c has queued so far has been answered
// or dropped.
func Flush(c *Client, ctx context.Context) error { return c.flush(ctx) }
