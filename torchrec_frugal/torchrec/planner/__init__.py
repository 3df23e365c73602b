"""FrugalShardingPlanner, its cost-model choice, stats, storage and topologies."""
