package redlock

// Reentrancy (WithOwner). Every acquisition of one owner shares an owner
// token derived from the owner ID (keys.go, newToken), so the acquire
// script counts the owner's keys as its own, and each acquisition adds its
// acquisition ID, new for every attempt, as a field of the hash
// "<key>\x00holds" beside each lock key, in the same script. Release removes
// its own field and deletes the lock key only when no hold is left; extend
// and re-entry only raise TTLs, never lower them, since holds share the
// keys. A retried command never counts twice: its acquisition ID is the
// same. With fencing, the hash also notes the token of the current hold
// (field "_t") for re-entries to keep (fencing.go).

// holdsKeys returns the holds hashes of the lock keys.
func holdsKeys(lockKeys []string) []string {
	keys := make([]string, len(lockKeys))
	for i, k := range lockKeys {
		keys[i] = k + holdsSuffix
	}
	return keys
}
