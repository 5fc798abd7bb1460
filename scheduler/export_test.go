package scheduler

// IndexedNames returns the number of names in s's name index (for the
// tests of package scheduler_test).
func IndexedNames(s *Scheduler) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.names)
}

// RefusalText is refusalText (for the tests of package scheduler_test).
var RefusalText = refusalText
