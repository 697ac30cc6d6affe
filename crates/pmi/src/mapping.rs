//! `PMI_process_mapping`: which node each rank of a job runs on, in the
//! vector form MPICH's hydra, Slurm and udrun publish:
//! `(vector,(start,nodes,ranks_per_node),...)`. Block `(s,n,k)` puts `k`
//! consecutive ranks on each of nodes `s..s+n`, one node after the other;
//! the blocks follow each other, and the whole pattern repeats while ranks
//! remain.

/// A parsed `PMI_process_mapping`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessMapping {
    /// `(start, nodes, ranks_per_node)` blocks, none of them empty.
    blocks: Vec<(u32, u32, u32)>,
}

impl ProcessMapping {
    /// The mapping of a job that places rank `r` on node `nodes[r]`: one
    /// block per run of consecutive ranks on one node.
    pub fn from_nodes(nodes: &[u32]) -> Self {
        let mut blocks: Vec<(u32, u32, u32)> = Vec::new();
        for &node in nodes {
            match blocks.last_mut() {
                Some((start, 1, ranks)) if *start == node => *ranks += 1,
                _ => blocks.push((node, 1, 1)),
            }
        }
        Self { blocks }
    }

    /// Parses the vector form; `None` for anything else (an empty value,
    /// another form, a block with no node or no rank, numbers that overflow).
    pub fn parse(text: &str) -> Option<Self> {
        let body = text.trim().strip_prefix('(')?.strip_suffix(')')?;
        let rest = body.trim_start().strip_prefix("vector")?;
        let mut blocks = Vec::new();
        for item in rest.split(')') {
            let item = item.trim_start_matches([',', ' ']);
            if item.is_empty() {
                continue;
            }
            let mut fields = item
                .strip_prefix('(')?
                .split(',')
                .map(|f| f.trim().parse::<u32>());
            let (start, nodes, ranks) = (
                fields.next()?.ok()?,
                fields.next()?.ok()?,
                fields.next()?.ok()?,
            );
            if fields.next().is_some() || nodes == 0 || ranks == 0 {
                return None;
            }
            start.checked_add(nodes)?;
            blocks.push((start, nodes, ranks));
        }
        (!blocks.is_empty()).then_some(Self { blocks })
    }

    /// How many distinct nodes the mapping places ranks on.
    pub fn node_count(&self) -> usize {
        let mut nodes: Vec<(u32, u32)> = self
            .blocks
            .iter()
            .map(|&(start, count, _)| (start, start + count))
            .collect();
        nodes.sort_unstable();
        // Count the union of the node ranges.
        let mut total = 0u64;
        let mut covered_to = 0u32;
        for (start, end) in nodes {
            let from = start.max(covered_to);
            if end > from {
                total += u64::from(end - from);
                covered_to = end;
            }
        }
        usize::try_from(total).unwrap_or(usize::MAX)
    }
}

impl std::fmt::Display for ProcessMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("(vector")?;
        for (start, nodes, ranks) in &self.blocks {
            write!(f, ",({start},{nodes},{ranks})")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launchers_forms_parse() {
        let one_host = ProcessMapping::parse("(vector,(0,1,4))").unwrap();
        assert_eq!(one_host.node_count(), 1);
        // hydra, 2 nodes of 2 ranks each; Slurm writes spaces after commas.
        let two = ProcessMapping::parse("(vector,(0,2,2))").unwrap();
        assert_eq!(two.node_count(), 2);
        let spaced = ProcessMapping::parse("(vector, (0,1,3), (1,1,2))").unwrap();
        assert_eq!(spaced.node_count(), 2);
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            "()",
            "(vector)",
            "(vector,(0,0,1))",
            "(vector,(0,1,0))",
            "(vector,(0,1))",
            "(vector,(0,1,2,3))",
            "(vector,(a,1,2))",
            "(vector,(4294967295,1,1))",
            "(matrix,(0,1,1))",
            "vector,(0,1,1)",
        ] {
            assert_eq!(ProcessMapping::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn placements_round_trip() {
        let nodes = [0, 1, 1, 0, 2];
        let mapping = ProcessMapping::from_nodes(&nodes);
        assert_eq!(
            mapping.to_string(),
            "(vector,(0,1,1),(1,1,2),(0,1,1),(2,1,1))"
        );
        let parsed = ProcessMapping::parse(&mapping.to_string()).unwrap();
        assert_eq!(parsed, mapping);
        assert_eq!(parsed.node_count(), 3);
        assert_eq!(
            ProcessMapping::from_nodes(&[0; 4]).to_string(),
            "(vector,(0,1,4))"
        );
    }
}
