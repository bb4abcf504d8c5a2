//! Who owns which partition: rendezvous (highest-random-weight) hashing of each partition
//! over the live members, pure and deterministic, so every member computes the same owners
//! from the same membership without talking to the others.
//!
//! For partition `p`, every member `m` gets the score `splitmix64(fnv1a64("<m>/<p>"))`; the `copies`
//! members with the highest scores own `p`, in score order, and the first is its
//! **primary** (the one that exports its traces). A member joining or leaving moves only the
//! partitions whose top `copies` it enters or leaves (about `copies × P / members` of them),
//! never reshuffles the rest.

use msgtrail_core::partition::{fnv1a64, Partition};

/// The role a member holds a partition in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Role {
    /// The first owner: applies the partition and exports its traces.
    Primary,
    /// Another owner: applies the partition, exports nothing.
    Copy,
}

/// The score of `member` for `partition`: higher wins. FNV-1a alone scores names that
/// differ in one late character nearly alike (one member then loses every partition), so its
/// value goes through the SplitMix64 finalizer, which spreads every input bit over the word.
fn score(member: &str, partition: Partition) -> u64 {
    let mut z = fnv1a64(format!("{member}/{partition}").as_bytes());
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The owners of `partition` among `members`, primary first; at most `copies` of them.
pub(crate) fn owners<'a>(
    partition: Partition,
    members: impl IntoIterator<Item = &'a str>,
    copies: usize,
) -> Vec<&'a str> {
    let mut ranked: Vec<(u64, &str)> = members
        .into_iter()
        .map(|m| (score(m, partition), m))
        .collect();
    // Ties (a 64-bit collision) are broken by name, so that the order is total.
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    ranked.dedup_by(|a, b| a.1 == b.1);
    ranked.into_iter().take(copies).map(|(_, m)| m).collect()
}

/// The partitions `me` holds among `members` (which should include `me`), with its role in
/// each, in partition order.
pub(crate) fn held<'a>(
    me: &str,
    members: impl IntoIterator<Item = &'a str> + Clone,
    copies: usize,
) -> Vec<(Partition, Role)> {
    Partition::all()
        .filter_map(|p| {
            let o = owners(p, members.clone(), copies);
            match o.iter().position(|m| *m == me) {
                Some(0) => Some((p, Role::Primary)),
                Some(_) => Some((p, Role::Copy)),
                None => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use msgtrail_core::partition::PARTITIONS;

    const THREE: [&str; 3] = ["listener-a", "listener-b", "listener-c"];

    #[test]
    fn every_partition_gets_copies_distinct_owners() {
        for p in Partition::all() {
            let o = owners(p, THREE, 2);
            assert_eq!(o.len(), 2);
            assert_ne!(o[0], o[1]);
        }
        // Fewer members than copies: every member owns it.
        assert_eq!(
            owners(Partition::new(3).unwrap(), ["solo"], 2),
            vec!["solo"]
        );
    }

    #[test]
    fn every_member_computes_the_same_owners_in_any_order() {
        let reversed = ["listener-c", "listener-b", "listener-a"];
        for p in Partition::all() {
            assert_eq!(owners(p, THREE, 2), owners(p, reversed, 2));
        }
    }

    #[test]
    fn held_partitions_add_up_to_copies_times_partitions_with_one_primary_each() {
        let all: Vec<Vec<(Partition, Role)>> = THREE.iter().map(|m| held(m, THREE, 2)).collect();
        let total: usize = all.iter().map(Vec::len).sum();
        assert_eq!(total, 2 * usize::from(PARTITIONS));
        let primaries = all
            .iter()
            .flatten()
            .filter(|(_, r)| *r == Role::Primary)
            .count();
        assert_eq!(primaries, usize::from(PARTITIONS));
        // Spread: nobody holds none, nobody holds them all.
        for h in &all {
            assert!((4..16).contains(&h.len()), "{h:?}");
        }
    }

    #[test]
    fn a_member_leaving_moves_only_its_own_partitions() {
        let before: Vec<Vec<&str>> = Partition::all().map(|p| owners(p, THREE, 1)).collect();
        let after: Vec<Vec<&str>> = Partition::all()
            .map(|p| owners(p, ["listener-a", "listener-b"], 1))
            .collect();
        for (b, a) in before.iter().zip(&after) {
            if b[0] != "listener-c" {
                assert_eq!(b, a, "a partition not on the leaver moved");
            } else {
                assert_ne!(a[0], "listener-c");
            }
        }
    }

    #[test]
    fn with_two_copies_a_dead_member_leaves_every_partition_an_owner_that_had_it() {
        for p in Partition::all() {
            let before = owners(p, THREE, 2);
            let after = owners(p, ["listener-a", "listener-b"], 2);
            // A survivor that held it holds it still: no gap while the new copy rebuilds.
            assert!(before
                .iter()
                .filter(|m| **m != "listener-c")
                .all(|m| after.contains(m)));
        }
    }
}
