"""The overlap mechanisms strategies share, written once: the split and its schedule (`split`),
where its cuts give the chunks equal FLOPs (`balance`, free of torch: strategies import it at
once), how a chunk's partial sums are reduced (`reducers`), the sequence-parallel layer and its
exchanges (`sequence_parallel`), its shard layout and rank-ordered plan (`sp_schedule`), and the P2P
decomposition of all-gather / reduce-scatter (`flash_overlap`). A strategy file in `strategies/`
picks a mechanism and its knobs; the mechanism lives here."""
