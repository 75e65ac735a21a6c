//! Partitioned streams: which partition an ordering key's entries go to ([`of_key`]), what a
//! partition's stream is called ([`stream_key`]), and which member of a group reads each
//! partition ([`assign`]). Each is a pure function of what it is given, so every producer and
//! every replica that sees the same inputs computes the same answer without talking to the
//! others. Agreement is not what keeps two replicas off one partition, though: each partition
//! is read under a consumer lease in Redis, and a replica whose view of the members is behind
//! finds the lease taken and waits. The functions only make the views converge on one owner per
//! partition, balanced, with few partitions moving when a member joins or leaves.

/// The most partitions a stream may have: enough for many times the replicas a group runs,
/// few enough that a replica's partitions fit one subscription's bookkeeping.
pub const MAX_PARTITIONS: u32 = 1024;

/// The stream that holds partition `partition` of `key`: `key:{partition}`. The hash tag
/// spreads a stream's partitions over a cluster's slots. A key that has a hash tag of its own
/// keeps it, and all its partitions share its slot.
pub fn stream_key(key: &str, partition: u32) -> String {
    format!("{key}:{{{partition}}}")
}

/// The partition an entry with ordering key `key` belongs to, of `partitions`: 32-bit FNV-1a of
/// the key's bytes, modulo `partitions`. FNV-1a is a few lines in any language (Go has it in
/// `hash/fnv`), so a producer that writes to the partitions itself picks the same one as
/// `Publish` does.
pub fn of_key(key: &[u8], partitions: u32) -> u32 {
    fnv1a(key) % partitions.max(1)
}

/// The partition of each entry published together: its ordering key's ([`of_key`]), or for an
/// entry without one the partitions in turn, from `turn` on, so that unkeyed entries spread
/// over them rather than pile onto one.
pub fn route<'a>(
    keys: impl IntoIterator<Item = Option<&'a [u8]>>,
    partitions: u32,
    turn: u32,
) -> Vec<u32> {
    let partitions = partitions.max(1);
    let mut next = turn;
    keys.into_iter()
        .map(|key| match key {
            Some(key) => of_key(key, partitions),
            None => {
                next = next.wrapping_add(1);
                next.wrapping_sub(1) % partitions
            }
        })
        .collect()
}

/// Who reads each partition: `owners[p]` is the index in `members` of partition `p`'s owner.
/// Every member gets `partitions / members` partitions or one more (the extra ones going to
/// the members that rank first by a hash of their name), so no two members' shares differ by
/// more than one. Each partition goes to the member that ranks it highest (rendezvous hashing)
/// among those with room: a member joining or leaving moves few partitions besides its own
/// share. The answer depends on the set of names, not their order; duplicates count once.
/// Empty `members`: nobody owns anything.
pub fn assign<S: AsRef<str>>(members: &[S], partitions: u32) -> Vec<Option<usize>> {
    let mut ranked: Vec<(u32, &str, usize)> = members
        .iter()
        .enumerate()
        .map(|(index, name)| (fnv1a(name.as_ref().as_bytes()), name.as_ref(), index))
        .collect();
    ranked.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    ranked.dedup_by(|a, b| a.1 == b.1);
    if ranked.is_empty() {
        return vec![None; partitions as usize];
    }
    let (share, extra) = (
        partitions as usize / ranked.len(),
        partitions as usize % ranked.len(),
    );
    let mut room: Vec<usize> = (0..ranked.len())
        .map(|rank| share + usize::from(rank < extra))
        .collect();
    (0..partitions)
        .map(|partition| {
            let (rank, _) = ranked
                .iter()
                .enumerate()
                .filter(|(rank, _)| room[*rank] > 0)
                .max_by_key(|(_, (_, name, _))| (weight(name, partition), *name))?;
            room[rank] -= 1;
            Some(ranked[rank].2)
        })
        .collect()
}

/// How much `member` wants `partition`: the rendezvous hash of the pair.
fn weight(member: &str, partition: u32) -> u32 {
    let mut hash = fnv1a(member.as_bytes());
    for byte in partition.to_le_bytes() {
        hash = (hash ^ u32::from(byte)).wrapping_mul(FNV_PRIME);
    }
    // FNV's low bits mix poorly on short inputs: a finalizer spreads the last bytes over all.
    hash ^= hash >> 16;
    hash = hash.wrapping_mul(0x85eb_ca6b);
    hash ^= hash >> 13;
    hash
}

const FNV_OFFSET: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;

fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(FNV_OFFSET, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(FNV_PRIME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fnv1a_matches_the_published_vectors() {
        assert_eq!(fnv1a(b""), 0x811c_9dc5);
        assert_eq!(fnv1a(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn a_partition_stream_carries_its_number_as_a_hash_tag() {
        assert_eq!(stream_key("orders", 3), "orders:{3}");
        assert_eq!(stream_key("{shop}:orders", 0), "{shop}:orders:{0}");
    }

    #[test]
    fn entries_go_to_their_keys_partition_and_unkeyed_ones_take_turns() {
        let a = of_key(b"a", 4);
        let keys = [Some(&b"a"[..]), None, Some(&b"a"[..]), None, None];
        assert_eq!(route(keys, 4, 3), vec![a, 3, a, 0, 1]);
    }

    #[test]
    fn nobody_owns_anything_without_members() {
        assert_eq!(assign::<&str>(&[], 3), vec![None, None, None]);
    }

    fn names() -> impl Strategy<Value = Vec<String>> {
        proptest::collection::vec("[a-z]{1,6}-[0-9]{1,3}", 1..8)
    }

    fn loads(owners: &[Option<usize>], members: usize) -> Vec<usize> {
        let mut loads = vec![0; members];
        for owner in owners {
            loads[owner.expect("owned")] += 1;
        }
        loads
    }

    proptest! {
        #[test]
        fn every_key_has_one_partition_in_range(key in proptest::collection::vec(any::<u8>(), 0..40), partitions in 1..MAX_PARTITIONS) {
            prop_assert!(of_key(&key, partitions) < partitions);
        }

        #[test]
        fn every_partition_has_one_owner_and_shares_differ_by_at_most_one(mut members in names(), partitions in 0u32..200) {
            members.sort();
            members.dedup();
            let owners = assign(&members, partitions);
            prop_assert_eq!(owners.len(), partitions as usize);
            let loads = loads(&owners, members.len());
            let (least, most) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
            prop_assert!(most - least <= 1, "loads {:?}", loads);
        }

        #[test]
        fn the_answer_depends_on_the_names_not_their_order(members in names(), partitions in 0u32..100, seed in any::<u64>()) {
            let mut shuffled = members.clone();
            // A deterministic shuffle: rotate, then reverse when the seed says so.
            let len = shuffled.len();
            shuffled.rotate_left(seed as usize % len);
            if seed % 2 == 1 {
                shuffled.reverse();
            }
            let by_name = |list: &[String]| -> Vec<Option<String>> {
                assign(list, partitions).into_iter().map(|o| o.map(|i| list[i].clone())).collect()
            };
            prop_assert_eq!(by_name(&members), by_name(&shuffled));
        }

        #[test]
        fn a_member_joining_moves_few_partitions(mut members in names(), joiner in "[A-Z]{1,6}", partitions in 1u32..200) {
            members.sort();
            members.dedup();
            let before: Vec<String> = assign(&members, partitions).into_iter().map(|o| members[o.unwrap()].clone()).collect();
            let mut after_members = members.clone();
            after_members.push(joiner.clone());
            let after: Vec<String> = assign(&after_members, partitions).into_iter().map(|o| after_members[o.unwrap()].clone()).collect();
            let moved_to_others = before.iter().zip(&after).filter(|(b, a)| b != a && **a != joiner).count();
            let to_joiner = after.iter().filter(|a| **a == joiner).count();
            // The joiner takes its share; the others trade at most as many among themselves
            // as the shares' rounding shifts, never a reshuffle of the whole stream.
            prop_assert!(to_joiner <= (partitions as usize).div_ceil(after_members.len()));
            prop_assert!(moved_to_others <= after_members.len() + to_joiner, "moved {} besides the joiner's {}", moved_to_others, to_joiner);
        }
    }
}
